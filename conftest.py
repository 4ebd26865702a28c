"""Makes ``pytest scenarios/`` collect the YAML scenarios (see kvconform.fronts.pytest_plugin)."""

pytest_plugins = ["kvconform.fronts.pytest_plugin"]

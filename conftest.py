"""Makes ``pytest scenarios/`` collect the YAML scenarios (see kvconform.harness.pytest_plugin)."""

pytest_plugins = ["kvconform.harness.pytest_plugin"]

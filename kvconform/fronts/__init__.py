"""The fronts: thin layers over the session (CLI, pytest plugin, explain, doctor, progress)."""

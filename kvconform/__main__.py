"""``python -m kvconform``: the same as the ``kvconform`` command."""

from kvconform.harness.cli import console_main

console_main()

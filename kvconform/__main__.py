"""``python -m kvconform``: the same as the ``kvconform`` command."""

from kvconform.fronts.cli import console_main

console_main()

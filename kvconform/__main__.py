"""``python -m kvconform``: the same as the ``kvconform`` command."""

import sys

from kvconform.harness.cli import main

sys.exit(main())

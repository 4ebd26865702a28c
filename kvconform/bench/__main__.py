import sys

from kvconform.bench.cli import main

sys.exit(main())

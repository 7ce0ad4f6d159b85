"""`python -m ppsim.cli`: the same entry point as the `ppsim` script."""

import sys

from ppsim.cli.main import main

sys.exit(main())

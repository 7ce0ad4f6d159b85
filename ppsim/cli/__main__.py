"""`python -m ppsim.cli`: the same entry point as the `ppsim` script."""

from ppsim.cli.main import entry

entry()

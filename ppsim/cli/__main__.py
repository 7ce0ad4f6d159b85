"""`python -m ppsim.cli`: the same entry point as the `ppsim` script."""

from ppsim.cli.main import entry

# Guarded: a spawned worker (ppsim.job.pricing) imports the main module again, as
# __mp_main__, and must not run the command a second time.
if __name__ == "__main__":
    entry()

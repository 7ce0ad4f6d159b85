"""ppsim: plan, simulate, run and diff uneven pipeline-parallel splits."""

# The two quickstart commands: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test setup lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/ppsim demo

# The in-process tests on two workers, then the real torchrun launches one at a time
# (tests/e2e/launches.py pools them; two launches at once are no faster on two cores).
test: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest -n 2 tests/unit tests/property tests/tui
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/e2e
	.venv/bin/ruff check .

lint: setup
	.venv/bin/ruff check .

bench: setup
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b; done

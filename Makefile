# The two quickstart commands: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test setup lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/ppsim demo

# `-m "not e2e"` skips the real torchrun launches (tests/e2e/launches.py pools them).
test: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest
	.venv/bin/ruff check .

lint: setup
	.venv/bin/ruff check .

bench: setup
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b; done

# The two quickstart commands: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test setup lint bench

# Setup installs without byte-compiling (pip --no-compile): modules are compiled when
# first imported and cached in __pycache__ (git-ignored). A PYTHONDONTWRITEBYTECODE
# inherited from the shell would make every process compile torch again (an import of
# torch and torch._dynamo: ~11 s instead of ~4 s).
unexport PYTHONDONTWRITEBYTECODE

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/ppsim demo

# Every test on three workers: the real torchrun launches (tests/e2e, pooled by
# launches.py) run in order on one worker, whose ranks wait on each other part of the
# time, while the other two take the in-process tests (tests/conftest.py's scheduler).
# A worker then sees two thirds of a core or less: the plan tests give budgets their
# searches finish within at a third of one. scripts/warm_tests.sh first collects the tests
# once per .venv, so a fresh clone's workers find the rewritten test modules cached.
test: setup
	@bash scripts/warm_tests.sh
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest -n 3 tests/e2e tests/unit tests/property \
		tests/tui
	.venv/bin/ruff check .

lint: setup
	.venv/bin/ruff check .

bench: setup
	for b in benchmarks/bench_*.py; do .venv/bin/python $$b; done

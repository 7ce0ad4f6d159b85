import gc
import os

import pytest
from hypothesis import HealthCheck, settings

# CI runs with CI=true: a fixed, derandomised profile keeps runs reproducible.
settings.register_profile("ci", derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every object alive once the tests are collected (torch, textual, ppsim, the test
    modules) moves to the permanent generation, so the collector's full passes walk only
    what the tests make (its time in the property tests fell by a third)."""
    gc.freeze()


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) the hook is unknown
def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201 - xdist's hook
    """`pytest -n 3`: the e2e tests are one unit of work, run in order on one worker (they
    share its pool of launches, tests/e2e/launches.py), the largest unit so the first
    sent; every other test module is a unit of its own, for whichever worker is free, so
    its module-scoped fixtures are built once."""
    from xdist.scheduler import LoadScopeScheduling

    class E2EOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if nodeid.startswith("tests/e2e/") else nodeid.split("::")[0]

    return E2EOnOneWorker(config, log)


@pytest.fixture(scope="module")
def group():
    """A gloo process group of one, for the executor's pieces that take a group (the
    module skips first where torch is missing)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()

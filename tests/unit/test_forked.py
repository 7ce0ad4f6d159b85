"""The forked torchrun's start-up: what a child inherits from the process it forks from."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch")

from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: E402

from ppsim.executor import forked  # noqa: E402


def test_a_forked_child_inherits_every_object_frozen_and_the_parent_keeps_none() -> None:
    before = gc.get_freeze_count()

    def child() -> int:
        print(gc.get_freeze_count(), flush=True)
        return 0

    proc = forked.ForkedProcess(child, {})
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 0
    # The child's collections skip the parent's objects (a test session: ~10^5 or more).
    assert int(out) > 10_000
    assert gc.get_freeze_count() == before


def test_the_rendezvous_names_an_event_after_the_method_that_recorded_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torchs = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", torchs)
    forked._cheap_rendezvous_names()
    ours = dynamic_rendezvous.get_method_name
    assert ours is not torchs

    class Handler:
        def _record(self, name_of) -> str:  # noqa: ANN001 - a get_method_name
            return name_of()

        def next_rendezvous(self, name_of) -> str:  # noqa: ANN001
            return self._record(name_of)

    assert Handler().next_rendezvous(ours) == Handler().next_rendezvous(torchs) \
        == "next_rendezvous"
    assert ours(10_000) == torchs(10_000) == "no_method_name"

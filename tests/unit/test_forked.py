"""The forked torchrun's start-up: what a child inherits from the process it forks from."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch")

from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: E402

from ppsim.executor import forked  # noqa: E402


def test_a_forked_child_inherits_every_object_frozen_and_the_parent_keeps_none() -> None:
    held = gc.get_freeze_count()  # another test's TUI may have frozen this worker's objects
    gc.unfreeze()
    before = gc.get_freeze_count()

    def child() -> int:
        print(gc.get_freeze_count(), flush=True)
        return 0

    tracked = len(gc.get_objects())  # what the parent holds as it forks (torch: ~10^5)
    proc = forked.ForkedProcess(child, {})
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 0
    # The child's collections skip the parent's objects: every one of them is frozen (a
    # few die between the count and the fork).
    assert int(out) > 0.9 * tracked > 10_000
    assert gc.get_freeze_count() == before == 0
    # A parent that had frozen objects itself (the TUI) keeps them frozen; it was left
    # with none, whichever test ran first in the worker.
    gc.freeze()
    frozen = gc.get_freeze_count()
    proc = forked.ForkedProcess(child, {})
    proc.stdout.read()
    assert proc.wait(timeout=30) == 0
    assert gc.get_freeze_count() > 0.9 * frozen  # (a few die meanwhile), not 0
    if not held:
        gc.unfreeze()


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

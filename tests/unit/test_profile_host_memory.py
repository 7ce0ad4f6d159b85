"""`ppsim profile` of a model whose pieces cannot fit this host is refused in one line
before any process starts (it ended in the OOM killer's SIGKILL and a traceback)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from ppsim.cli import runchecks  # noqa: E402
from ppsim.cli.main import main  # noqa: E402
from ppsim.executor import measure  # noqa: E402


@pytest.fixture
def no_profile(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a profile started")

    monkeypatch.setattr(measure, "profile", refuse)


def _one_line(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_model_too_large_for_the_host_is_refused(monkeypatch, capsys, no_profile) -> None:
    monkeypatch.setattr(runchecks, "available_host_bytes", lambda: 20e9)
    line = _one_line(capsys, main(["profile", "--preset", "llama3-70b"]))
    assert line.startswith("ppsim profile: error: model: the profile's pieces")
    assert "20.0 GB free" in line and "--device cuda" in line


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the copies need two cores")
def test_the_need_is_the_pieces_and_their_gradients_in_each_process(monkeypatch, capsys,
                                                                     no_profile) -> None:
    monkeypatch.setattr(runchecks, "available_host_bytes", lambda: 1e9)
    line = _one_line(capsys, main(["profile", "--preset", "llama3-8b"]))
    # Llama 3 8B in bf16: embedding and head 128,256 x 4,096 each, four decoder layers of
    # q, k, v, o (4,096 x (4,096 + 2 x 1,024) + 4,096²), the gated MLP (3 x 4,096 x
    # 14,336) and two norms; a weight and its gradient; in this process and the two
    # pipeline ranks' copies timed beside it.
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    params = 2 * 128256 * 4096 + 4096 + 4 * layer
    # ...and the head's saved tensors, the largest piece's (its logits), with the logit
    # gradient its backward makes beside them, while it is timed.
    from ppsim.config.schema import config_from_dict
    from ppsim.pipeline.problem import model_costs

    head = model_costs(config_from_dict({"model": {"preset": "llama3-8b"}})).head
    need = (2 * 2 * params + head.activation_bytes + head.transient_bytes) * 3
    assert head.transient_bytes >= 8192 * 128256 * 2  # the logit gradient, bf16 at least
    assert f"take {need / 1e9:,.1f} GB over 3 process(es)" in line, line


def test_ranks_sharing_a_device_are_timed_beside_the_profile() -> None:
    fields = {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 4,
              "ffn_hidden_size": 256, "vocab_size": 2048, "seq_length": 64}
    assert measure.processes_at_once(fields, "cpu", [0, 0]) == 3
    assert measure.processes_at_once(fields, "cuda", [0, 1]) == 1
    assert measure.processes_at_once({**fields, "tp": 2}, "cuda", [0, 1]) == 2


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 6), heads=st.sampled_from([1, 2, 4]), width=st.integers(1, 8),
       ffn=st.integers(8, 96), vocab=st.integers(16, 300), moe=st.booleans())
def test_the_estimate_never_passes_what_the_profiler_builds(layers, heads, width, ffn,
                                                           vocab, moe) -> None:
    """The refusal counts a lower bound: no profile that fits is refused for memory."""
    import torch

    from ppsim.config.schema import config_from_dict
    from ppsim.executor.profile import Profiler
    from ppsim.pipeline.problem import model_costs

    model = {"kind": "transformer", "num_layers": layers, "hidden_size": 8 * width,
             "num_heads": heads, "num_kv_heads": heads, "ffn_hidden_size": ffn,
             "vocab_size": vocab, "seq_length": 8, "dtype": "fp32"}
    if moe:
        model.update(num_experts=4, top_k=2, moe_ffn_hidden_size=ffn,
                     layers=f"dense*1, moe*{layers - 1}" if layers > 1 else "moe*1")
    cfg = config_from_dict({"model": model, "pipeline": {"pp": 1}})
    built = Profiler(cfg.model.fields(), torch.device("cpu"))
    real = sum(p.numel() for piece in built.pieces for p in piece.module.parameters())
    assert 0 < runchecks.profiled_params(model_costs(cfg)) <= real

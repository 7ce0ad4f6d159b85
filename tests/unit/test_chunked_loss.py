"""torchtitan's ChunkedLossWrapper (every config-registry function's loss) as
Architecture.loss_chunks: the head and the loss run chunk by chunk, forward and backward,
inside the last stage's forward."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.run_frameworks import whole_loss
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.layerops import head_activation_bytes, head_transient_bytes
from ppsim.costs.transformer import Accelerator, Architecture, transformer_costs
from tests.helpers import run_cli

ACC = Accelerator(peak_tflops=989.0, memory_bandwidth_gbps=3350.0)
H100 = ["--hardware", "h100-80gb"]


def llama(**kw) -> Architecture:
    return Architecture(**{**MODEL_PRESETS["llama3-8b"], **kw})


def test_the_head_keeps_the_output_and_its_gradient_and_holds_one_chunk() -> None:
    """torchtitan b5bcd76 (components/loss.py, ChunkedLossWrapper): each chunk runs lm_head
    and cross-entropy and backward at once, its hidden gradient copied into an fp32
    buffer, cast to bf16 after the last; the decoder's output and that gradient wait for
    the decoder's backward. A chunk at its height: the bf16 logits, the fp32 log-softmax
    output, its fp32 gradient and its input's. llama3-8b, 8,192 tokens, 8 chunks."""
    a = llama(loss_chunks=8)
    tokens, h, vocab = 8192, 4096, 128256
    norm = tokens * (h * 2 + 4)  # the final RMSNorm's bf16 input and fp32 statistics
    assert head_activation_bytes(a) == norm + 2 * tokens * h * 2
    chunk = tokens // 8 * vocab
    assert head_transient_bytes(a) == chunk * (2 + 4 + 4 + 4) + tokens * h * 4
    whole = llama()
    assert head_activation_bytes(a) < head_activation_bytes(whole) - tokens * vocab * 3


@settings(max_examples=30, deadline=None)
@given(chunks=st.sampled_from([1, 2, 4, 8, 16]), tp=st.sampled_from([1, 2, 4, 8]),
       seq=st.sampled_from([1024, 4096, 8192]), mbs=st.sampled_from([1, 2]))
def test_the_head_s_work_moves_into_the_forward_whole(chunks: int, tp: int, seq: int,
                                                       mbs: int) -> None:
    """The same work, the projection's and the loss's backward now in the forward: only
    the final norm's backward stays in B, and W has nothing of the head left."""
    a = llama(num_layers=2, tp=tp, seq_length=seq, micro_batch_size=mbs)
    whole, chunked = (transformer_costs(x, ACC).head for x in (a, replace(a, loss_chunks=chunks)))
    assert chunked.forward_ms + chunked.backward_ms == pytest.approx(
        whole.forward_ms + whole.backward_ms, rel=1e-12)
    assert chunked.forward_ms > whole.forward_ms
    assert 0 < chunked.backward_ms < whole.backward_ms / 20
    assert chunked.weight_grad_bytes == 0
    assert chunked.activation_bytes < whole.activation_bytes


def _peak(*argv: str) -> float:
    r = run_cli(["simulate", *H100, *argv, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ranks"][0]["peak_memory_bytes"]


def test_a_registry_function_chunks_its_loss() -> None:
    """llama3_8b's peak is its job's with --loss.num_chunks 8, and below the whole loss's."""
    line = ["--torchtitan-config", "llama3_8b", "--gpus", "8"]
    same = ["--preset", "llama3-8b", "--parallelism.data_parallel_shard_degree", "8",
            "--training.num_tokens_per_microbatch_per_dp_rank", "8192",
            "--training.max_context_length", "8192", "activation-checkpoint:selective"]
    assert _peak(*line) == _peak(*same, "--loss.num_chunks", "8") < _peak(*same)


def test_chunks_the_tokens_do_not_split_into_are_refused() -> None:
    r = run_cli(["simulate", *H100, "--torchtitan-config", "llama3_8b", "--gpus", "8",
                 "--loss.num_chunks", "3"])
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "ppsim simulate: error: model.seq_length: seq_length / cp = 8,192 tokens do not "
        "split into 3 equal loss chunks"), lines


def test_a_run_computes_the_loss_whole(capsys: pytest.CaptureFixture) -> None:
    """The executor has no chunked loss: a run's config prices the loss whole, and says so."""
    cfg = config_from_dict({"model": {"preset": "tiny-llm", "loss_chunks": 4},
                            "pipeline": {"pp": 2, "microbatches": 2}})
    assert cfg.model.arch.loss_chunks == 4
    assert whole_loss(cfg).model.arch.loss_chunks == 0
    assert "ChunkedLossWrapper's 4 loss chunks taken, not run" in capsys.readouterr().err


def test_plan_writes_the_chunks_back() -> None:
    r = run_cli(["plan", *H100, "--torchtitan-config", "llama3_8b", "--gpus", "8",
                 "--global-batch-size", "16", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["best"]["torchtitan_job"]["loss"] == {"num_chunks": 8}

"""The microbatch counts `plan --gpus` offers: those Megatron (or, for a torchtitan job,
torch) runs, fewer than the pipeline ranks included.

Megatron-LM d98e8a6, megatron/core/pipeline_parallel/schedules.py:
- forward_backward_pipelining_without_interleaving: num_warmup_microbatches =
  min(pp - rank - 1, num_microbatches), no check of the count: 1F1B runs any m >= 1;
- forward_backward_pipelining_with_interleaving: microbatch_group_size_per_vp_stage
  within [pp, m] (ValueError), m % group 0 or >= pp (RuntimeError): interleaving runs
  any m >= pp, with --microbatch-group-size-per-virtual-pipeline-stage where pp does
  not divide m.
torch 2.13, torch/distributed/pipelining/schedules.py: Schedule1F1B refuses m below
the stages; ScheduleInterleaved1F1B takes m divisible by max(1, m // pp), m < pp too.
"""

from __future__ import annotations

import contextlib
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser, main
from ppsim.job.shapes import shapes


def _arch(*argv: str):
    return config_from_args(build_parser().parse_args(["simulate", *argv])).model.arch


def _plan(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", *argv, "--json"])
    assert code == 0, code
    return json.loads(out.getvalue())


def test_a_large_model_on_few_gpus_at_a_small_batch_fits_with_fewer_microbatches_than_ranks(
        ) -> None:
    # Llama-3-70B on 32 H100s at a global batch of 2: a replica needs pp 4 to hold its
    # weights and optimizer state (pp 2 at tp 8 holds 70B / 16 x 18 B: over 80 GB), and
    # then runs 2 or 1 microbatches through 4 ranks, as Megatron's 1F1B does.
    doc = _plan("--preset", "llama3-70b", "--hardware", "h100-80gb", "--gpus", "32",
                "--global-batch-size", "2", "--time-budget", "10", "--top", "3")
    best = doc["best"]
    assert best["fits"] and best["schedule"] == "1f1b"
    assert best["microbatches"] < best["pp"]
    assert "--pipeline-model-parallel-size 4" in best["megatron_flags"]


@settings(max_examples=30, deadline=None)
@given(gpus=st.sampled_from([8, 16, 32, 64]), gbs=st.sampled_from([1, 2, 4, 8, 12, 16, 24]))
def test_every_pipeline_and_batch_megatron_runs_is_offered(gpus: int, gbs: int) -> None:
    a = _arch("--preset", "llama3-8b")
    found = {(s.pp, s.vpp, s.mbs) for s in shapes(a, gpus, gbs, 8, 32, {"tp": 8, "cp": 1})}
    runs = set()
    for pp in (p for p in range(1, 33) if (gpus // 8) % p == 0):
        dp = gpus // 8 // pp
        for vpp in (1, 2, 4, 8) if pp > 1 else (1,):
            for mbs in (1, 2, 4):
                m, rest = divmod(gbs, mbs * dp)
                # the batch divides; each chunk a layer; interleaving: m >= pp
                if not rest and m and pp * vpp <= 32 and (vpp == 1 or m >= pp):
                    runs.add((pp, vpp, mbs))
    assert found == runs


def test_interleaving_with_microbatches_pp_does_not_divide_exports_the_group_flag() -> None:
    # 12 microbatches over 8 ranks: Megatron refuses its default group (8: a last group
    # of 4 < pp) and runs groups of 12.
    doc = _plan("--preset", "llama3-8b", "--num-layers", "16", "--hardware", "h100-80gb",
                "--gpus", "64", "--global-batch-size", "12", "--tp", "8", "--pp", "8",
                "--vpp", "2", "--micro-batch-size", "1", "--time-budget", "5", "--top", "1")
    best = doc["best"]
    assert (best["microbatches"], best["vpp"]) == (12, 2)
    flags = best["megatron_flags"].split()
    i = flags.index("--microbatch-group-size-per-virtual-pipeline-stage")
    assert flags[i + 1] == "12"


def test_a_torchtitan_job_keeps_torchs_microbatch_rules() -> None:
    # 64 GPUs at tp 8 and a global batch of 4: pp 2, 4 and 8 run 1, 2 and 4 microbatches.
    def runs(*flags: str) -> tuple[set, set]:
        found = shapes(_arch("--preset", "llama3-8b", *flags), 64, 4, 8, 32,
                       {"tp": 8, "cp": 1, "mbs": 1})
        return ({(s.pp, s.microbatches) for s in found if s.vpp == 1},
                {(s.pp, s.microbatches) for s in found if s.vpp > 1})

    megatron, megatron_chunked = runs()
    assert megatron == {(2, 1), (4, 2), (8, 4)} and not megatron_chunked
    torch, torch_chunked = runs("--fsdp")
    assert not torch  # Schedule1F1B: m below the stages
    assert torch_chunked == {(2, 1), (4, 2), (8, 4)}  # one round of m



def test_held_interleaving_with_too_few_microbatches_names_megatrons_rule(capsys) -> None:
    # A global batch of 4 over pp 8 with vpp 2 held: every shape runs m <= 4 < pp, and
    # Megatron's interleaved group must lie within [pp, m].
    code = main(["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb", "--gpus", "64",
                 "--global-batch-size", "4", "--pp", "8", "--vpp", "2", "--time-budget", "5"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "error: --global-batch-size:" in err
    assert "Megatron refuses m = 4 at pp 8" in err and "[pp=8, m=4]" in err
    assert "give a larger global batch" in err

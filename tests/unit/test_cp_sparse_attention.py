"""DeepSeek sparse attention beside context parallelism: Megatron's DSAttention runs its
own context parallelism, gathering the keys, and asserts cp_comm_type allgather
(TransformerConfig.__post_init__ for --experimental-attention-variant dsa, and
DSAttention's forward for every DSA layer, a hybrid stack's 'D' too; both take
`all_gather` as the same type). The model is Megatron's functional test
gpt3_mcore_te_tp2_pp2_dsa's, at one stage and cp 2."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import run_main

DSA = """--num-layers 4 --hidden-size 512 --num-attention-heads 8 --multi-latent-attention
--q-lora-rank 192 --kv-lora-rank 64 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
--experimental-attention-variant dsa --disable-bias-linear --dsa-indexer-n-heads 64
--dsa-indexer-head-dim 128 --dsa-indexer-topk 2048 --micro-batch-size 1
--global-batch-size 8 --seq-length 4096 --max-position-embeddings 4096
--tensor-model-parallel-size 2 --sequence-parallel --vocab-size 50257
--hardware h100-80gb --gpus 8 --pp 1 --cp 2"""
HYBRID = DSA.replace("--num-layers 4", "--hybrid-layer-pattern D-D-D-D-").replace(
    "--experimental-attention-variant dsa", "")
WORDS = "DSAttention context parallelism currently supports cp_comm_type=allgather only"


@pytest.mark.parametrize("line", [DSA, HYBRID], ids=["variant", "hybrid"])
@pytest.mark.parametrize("kind", ["p2p", "a2a", "a2a+p2p"])
def test_a_sparse_attention_refuses_cp_traffic_other_than_the_gather(line: str,
                                                                     kind: str) -> None:
    sizes = ["--hierarchical-context-parallel-sizes", "1", "2"] if kind == "a2a+p2p" else []
    code, out, err = run_main(["simulate", *shlex.split(line), "--cp-comm-type", kind,
                               *sizes])
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("ppsim simulate: error: model.cp_comm_type: ")
    assert WORDS in lines[0] and f"it is {kind})" in lines[0]


@pytest.mark.parametrize("line", [DSA, HYBRID], ids=["variant", "hybrid"])
def test_the_default_ring_is_refused_and_the_gather_runs(line: str) -> None:
    code, _, err = run_main(["simulate", *shlex.split(line)])
    assert code == 2 and WORDS in err
    code, out, err = run_main(["simulate", *shlex.split(line), "--cp-comm-type",
                               "all_gather", "--json"])
    assert code == 0, err
    assert json.loads(out)["job"]["cp_comm_type"] == "all_gather"


def test_the_job_search_picks_no_ring_for_a_sparse_attention() -> None:
    """`plan --gpus` over cp 1 and 2 at the model's ring: only cp 1 is run."""
    args = shlex.split(DSA.replace("--gpus 8 --pp 1 --cp 2", "")) + [
        "--gpus", "4", "--tp", "2", "--json", "--time-budget", "2"]
    code, out, err = run_main(["plan", *args])
    assert code == 0, err
    plan = json.loads(out)
    assert plan["refused"] >= 1 and plan["candidates"]
    assert {c["cp"] for c in plan["candidates"]} == {1}


def _cp_rows(line: str) -> dict[str, tuple[float, float]]:
    code, out, err = run_main(["costs", *shlex.split(line), "--cp-comm-type", "all_gather",
                               "--json"])
    assert code == 0, err
    return {r["collective"]: (r["nbytes"], r["count"])
            for r in json.loads(out)["priced_collectives"] if r["collective"].startswith("cp ")}


@pytest.mark.parametrize("line", [DSA, HYBRID, DSA.replace("--tensor-model-parallel-size 2",
                                                           "--tensor-model-parallel-size 1")],
                         ids=["variant", "hybrid", "tp1"])
def test_the_gather_moves_the_latent_key_and_the_indexers_keys(line: str) -> None:
    """DSAttention gathers MLA's absorbed key (the 64-wide KV latent and its 8 rotary
    channels, one head, whole on every tensor rank) and DSAIndexer's 128-wide keys over
    cp; the backward reduce-scatters the latent's gradient alone (the gathered key kept,
    the indexer's keys without gradient). fp32 training (no --bf16): 4 bytes."""
    tokens, cp, w = 4096 // 2, 2, 4
    assert _cp_rows(line) == {
        "cp all-gather": (cp * tokens * (64 + 8) * w, 1),
        "cp indexer-key all-gather": (cp * tokens * 128 * w, 1),
        "cp reduce-scatter": (cp * tokens * (64 + 8) * w, 1)}


def test_the_layer_waits_for_those_gathers() -> None:
    """DeepSeek-V3's DSA layer (bf16, cp 2, tp 2): the simulation's cp collectives each
    way are dsa_comm's closed form, the forward's again under a full recompute."""
    from ppsim.config.schema import config_from_dict  # noqa: PLC0415
    from ppsim.costs.transformer import accelerator, transformer_costs  # noqa: PLC0415
    from ppsim.job.collectives import all_gather_ms, reduce_scatter_ms  # noqa: PLC0415
    from ppsim.job.layers import per_rank_arch, piece_collectives  # noqa: PLC0415
    from ppsim.job.model import build_job  # noqa: PLC0415
    from ppsim.job.traffic import Recomputed  # noqa: PLC0415

    c = config_from_dict({"model": {"preset": "deepseek-v3", "num_layers": 4,
                                    "layers": "dense*4", "experimental_attention_variant": "dsa",
                                    "cp": 2, "cp_comm_type": "all_gather", "tp": 2,
                                    "seq_length": 8192, "recompute": "none"},
                          "pipeline": {"pp": 1, "microbatches": 4},
                          "hardware": {"preset": "h100-80gb"}})
    job = build_job(c)
    assert job is not None
    acc, a = accelerator(c.hardware), per_rank_arch(job.arch)
    link, whole = job.link("cp"), 2 * 4096 * 2  # cp x a rank's tokens x bf16
    latent = whole * (512 + 64)  # kv_lora_rank + qk_rope_head_dim
    fwd = all_gather_ms(latent, link) + all_gather_ms(whole * 128, link)
    cost = transformer_costs(a, acc).layers[0]
    for full in (False, True):
        again = Recomputed(attention=full, full=full)
        comm = piece_collectives(job, a, acc, "dsa-dense", cost, again)
        (f,) = (x for x in comm.forward if x.group == "cp")
        (b,) = (x for x in comm.backward if x.group == "cp")
        assert f.total_ms == f.exposed_ms == pytest.approx(fwd)
        assert b.total_ms == b.exposed_ms == pytest.approx(
            reduce_scatter_ms(latent, link) + fwd * full)

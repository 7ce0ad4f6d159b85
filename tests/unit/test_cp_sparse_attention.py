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

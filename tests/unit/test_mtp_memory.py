"""The MTP stage's copy of the embedding table.

Megatron's GPTModel builds an embedding on every model chunk that holds MTP layers
(`if self.pre_process or self.mtp_process:` in megatron/core/models/gpt/gpt_model.py) and
keeps its weights in step with the first stage's ("If use Multi-Token Prediction (MTP),
we also need to maintain duplicated embedding weights in mtp process stage",
language_module.py). A stage holding both the embedding and the MTP layers has one table.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.problem import build_problem
from ppsim.plan.search import SplitSearch

# DeepSeek-V3 unsharded (one data-parallel rank, no expert parallelism): mixed-precision
# Adam keeps 18 bytes a parameter (bf16 weight 2, fp32 main gradient 4, fp32 master weight
# 4 and two fp32 moments 8), and its table is 129,280 x 7,168 (a multiple of 128 already).
TABLE_BYTES = 129_280 * 7_168 * 18
BASE = ["simulate", "--preset", "deepseek-v3", "--hardware", "h100-80gb", "--microbatches",
        "2", "--dp", "1", "--ep", "1", "--json"]


def _static(*argv: str) -> list[int]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*BASE, *argv]) == 0
    return [r["static_bytes"] for r in json.loads(out.getvalue())["ranks"]]


def test_the_mtp_stage_keeps_its_own_copy_of_the_embedding_table() -> None:
    """What the MTP layer adds to the stage that holds it: on the embedding's own stage
    (pp 1) its layer alone; on another (pp 2) its layer and the table (it was the layer
    alone there too: the copy was not counted)."""
    alone = _static("--pp", "1")[0] - _static("--pp", "1", "--mtp-num-layers", "0")[0]
    apart = _static("--pp", "2", "--split", "31,31")[1] \
        - _static("--pp", "2", "--split", "31,30", "--mtp-num-layers", "0")[1]
    assert apart - alone == TABLE_BYTES
    # The first stage, which holds the embedding, is the same either way.
    assert _static("--pp", "2", "--split", "31,31")[0] == \
        _static("--pp", "2", "--split", "31,30", "--mtp-num-layers", "0")[0]


def _problem(pp: int, split: list[int] | None, tied: bool, policy: bool):
    pipeline = {"pp": pp, "microbatches": 4, **({"split": split} if split else {})}
    # rotary positions: Megatron's MTP refuses learned ones (arguments.py)
    data = {"model": {"preset": "gpt3-1.3b", "mtp_layers": 1, "tie_embeddings": tied,
                      "position": "rotary"},
            "pipeline": pipeline, "hardware": {"preset": "h100-80gb"}}
    if policy:
        data["memory"] = {"recompute_modules": ["core_attn"],
                          "stage": [{"stage": 0, "recompute_layers": 3}]}
    return build_problem(config_from_dict(data))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.integers(1, 24), st.booleans(), st.booleans())
def test_the_planner_prices_the_mtp_stage_as_the_cost_model(pp: int, cut: int, tied: bool,
                                                            policy: bool) -> None:
    """The planner's O(1) stage bytes (prefix sums; a memory policy's own) count the MTP
    stage's table copy as the cost model's sum does, one stage or two, tied or not."""
    p = _problem(pp, [cut, 25 - cut] if pp == 2 else None, tied, policy)
    search = SplitSearch(p)
    for stage, cost in zip(p.split.stages, p.stage_costs, strict=True):
        static, _, _ = search.stage_bytes(stage.offset, stage.layers, stage.index)
        assert static == cost.static_bytes

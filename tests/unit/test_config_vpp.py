"""A config's vpp alone picks Megatron's interleaved 1F1B, as `--vpp` alone does (the
config was refused: "1f1b runs one chunk per rank but vpp = 2"); a schedule given beside
it is kept, and checked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.problem import build_problem


@given(st.integers(1, 4))
def test_a_config_s_vpp_alone_is_the_flag_s(vpp: int) -> None:
    from_file = config_from_dict({"model": {"preset": "tiny-gpt"}, "pipeline": {"vpp": vpp}})
    args = build_parser("simulate").parse_args(["simulate", "--preset", "tiny-gpt",
                                                "--vpp", str(vpp)])
    from_flag = config_from_args(args)
    assert from_file.pipeline.schedule == from_flag.pipeline.schedule
    assert from_file.pipeline.schedule == ("interleaved-1f1b" if vpp > 1 else "1f1b")


def test_a_schedule_given_beside_it_is_kept_and_checked() -> None:
    with pytest.raises(UserError) as e:
        build_problem(config_from_dict({"model": {"preset": "tiny-gpt"},
                                        "pipeline": {"vpp": 2, "schedule": "1f1b"}}))
    assert e.value.field == "pipeline.schedule"
    cfg = config_from_dict({"model": {"preset": "tiny-gpt"},
                            "pipeline": {"vpp": 2, "schedule": "interleaved-zb"}})
    assert cfg.pipeline.schedule == "interleaved-zb"

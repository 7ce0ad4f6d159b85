"""One way to change a config: flags, the TUI and plan variants all keep what they do
not change, and plan proposes exactly the shapes the schedules accept."""

from __future__ import annotations

import pytest

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.cli.plan_variants import variants
from ppsim.config.overrides import with_overrides, with_split
from ppsim.config.schema import SPLIT_KEYS, PipelineConfig, config_from_dict, load_config
from ppsim.errors import UserError
from ppsim.schedules.generators import SCHEDULES


def _cfg(pp: int = 2, layers: int = 8, m: int = 8) -> object:
    return config_from_dict({"model": {"preset": "tiny-gpt", "num_layers": layers},
                             "pipeline": {"pp": pp, "microbatches": m, "split": "even"},
                             "placement": {"devices": [0] * pp}})


@pytest.mark.parametrize("pp,m", [(2, 8), (2, 3), (4, 8)])
def test_plan_search_proposes_exactly_what_the_schedules_accept(pp: int, m: int) -> None:
    cfg = _cfg(pp, 16, m)
    proposed = {(v.cfg.pipeline.schedule, v.cfg.pipeline.vpp)
                for v in variants(cfg, ["schedule", "vpp"])}
    accepted = set()
    for name, spec in SCHEDULES.items():
        for vpp in (1, 2, 3, 4):
            try:
                spec.check(pp, vpp, m)
            except UserError:
                continue
            accepted.add((name, vpp))
    assert proposed == accepted
    assert ("interleaved-zb", 1) in proposed  # its check takes any vpp
    for v in variants(cfg, ["schedule", "vpp"]):
        assert v.cfg.placement == cfg.placement  # overrides keep [placement]


@pytest.mark.parametrize("schedule, chunked", [("1f1b", "interleaved-1f1b"),
                                               ("zb-h1", "zb-h1"), ("gpipe", "gpipe")])
def test_a_vpp_search_runs_megatrons_1f1b_interleaved(schedule: str, chunked: str) -> None:
    """--search vpp on 1F1B proposed (1f1b, vpp > 1), which 1F1B refuses, so it searched
    nothing and printed the plain plan; Megatron runs its 1F1B at vpp > 1 interleaved.
    Other schedules keep their name, at the vpp they take."""
    cfg = with_overrides(_cfg(2, 16, 8), pipeline={"schedule": schedule})
    got = {(v.cfg.pipeline.schedule, v.cfg.pipeline.vpp) for v in variants(cfg, ["vpp"])}
    want = {(schedule, 1)}
    for vpp in (2, 3, 4):
        try:
            SCHEDULES[chunked].check(2, vpp, 8)
        except UserError:
            continue
        want.add((chunked, vpp))
    assert got == want
    assert schedule != "1f1b" or len(want) == 4


def test_a_schedule_search_runs_the_v_schedules_at_their_two_chunks() -> None:
    """--search schedule kept the configured vpp 1, which ZB-V and DualPipeV refuse: the
    zero-bubble V schedules were never tried."""
    cfg = _cfg(2, 16, 8)
    got = {(v.cfg.pipeline.schedule, v.cfg.pipeline.vpp) for v in variants(cfg, ["schedule"])}
    assert {("zbv", 2), ("dualpipev", 2), ("zb-h1", 1), ("1f1b", 1)} <= got
    for name, vpp in got:
        SCHEDULES[name].check(2, vpp, 8)  # each one the schedule takes


def test_a_search_with_nothing_else_to_run_says_so(capsys) -> None:
    from ppsim.cli.main import main

    assert main(["plan", "--schedule", "zbv", "--search", "vpp", "--time-budget", "2"]) == 0
    err = capsys.readouterr().err
    assert "note: --search vpp: no variant but the configured one (zbv, pp=2)" in err, err


def test_with_split_clears_every_other_split_option() -> None:
    pipe = PipelineConfig(pp=4, layout="E|t*2|t*2|t*2|t*2L", first_stage_layers=1,
                          account_for_loss=True)
    out = with_split(pipe, split=[2, 2, 2, 2])
    assert out.split == [2, 2, 2, 2] and out.pp == 4
    assert all(getattr(out, k) == getattr(PipelineConfig(), k) for k in SPLIT_KEYS
               if k != "split")
    assert with_split(out) == PipelineConfig(pp=4)
    with pytest.raises(ValueError, match="not split options"):
        with_split(pipe, pp=2)


def test_overrides_keep_what_they_do_not_change_and_are_checked() -> None:
    cfg = _cfg()
    cfg.costs_file = "costs.json"
    out = with_overrides(cfg, pipeline={"microbatches": 4}, model={"recompute": "full"})
    assert out.placement == cfg.placement and out.costs_file == "costs.json"
    assert out.pipeline.split == "even" and out.model.recompute == "full"
    assert cfg.pipeline.microbatches == 8 and cfg.model.recompute == "none"  # a copy
    with pytest.raises(UserError, match="hardware.memory_bytes"):
        with_overrides(cfg, memory_bytes=-1.0)
    with pytest.raises(UserError, match="pipeline.split"):
        with_overrides(cfg, split={"split": [1, -1]})
    with pytest.raises(UserError, match="model.hidden"):
        with_overrides(cfg, model={"hidden": 3})


def test_flags_are_the_same_overrides(tmp_path) -> None:
    path = tmp_path / "f.toml"
    path.write_text('[model]\npreset = "tiny-gpt"\n[pipeline]\npp = 2\nlayout = "Et*4|t*4L"\n'
                    '[placement]\ndevices = [0, 0]\n')
    args = build_parser().parse_args(["simulate", "--config", str(path), "--split", "6,2",
                                      "--microbatches", "4", "--hardware", "h100-80gb"])
    got = config_from_args(args)
    # Each flag changes what it names and nothing else; the file keeps the rest.
    assert got.pipeline.split == [6, 2] and got.pipeline.layout is None
    assert got.pipeline.microbatches == 4 and got.pipeline.pp == 2
    assert got.hardware.memory_bytes == 80e9  # the H100's 80 GB replaces [hardware]
    assert got.placement.devices == [0, 0]
    assert got.model == load_config(str(path)).model

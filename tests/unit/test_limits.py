"""Limits first: oversized requests are refused from the config alone, with the estimate."""

from __future__ import annotations

import pytest

from ppsim.cli.main import main
from ppsim.config import limits
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError


def _cfg(pp: int = 4, m: int = 8, layers: int = 8, schedule: str = "1f1b", vpp: int = 1):
    return config_from_dict({"model": {"kind": "uniform", "num_layers": layers,
                                       "forward_ms": 1.0, "backward_ms": 2.0},
                             "pipeline": {"pp": pp, "vpp": vpp, "microbatches": m,
                                          "schedule": schedule}})


def test_op_count_counts_w_only_for_split_backward():
    assert limits.check_request(_cfg(4, 8), limits.SIMULATE) == 4 * 8 * 2
    assert limits.check_request(_cfg(4, 8, schedule="zb-h1"), limits.SIMULATE) == 4 * 8 * 3


def test_over_budget_names_the_estimate_the_limit_and_a_way_out():
    budget = limits.Budget(ops=100, where="this test", way_out="use fewer microbatches")
    with pytest.raises(UserError) as exc:
        limits.check_request(_cfg(4, 13), budget)
    text = str(exc.value)
    assert exc.value.field == "pipeline.microbatches"
    assert "104 ops" in text and "100" in text and "fewer microbatches" in text
    # the product it shows is the count: 4 x 1 x 13 alone read as 52
    assert "pp 4 x vpp 1 x 13 microbatches x 2 kinds (F, B) = 104 ops" in text
    with pytest.raises(UserError) as exc:
        limits.check_request(_cfg(4, 13, schedule="zb-h1"), budget)
    assert "x 13 microbatches x 3 kinds (F, B, W) = 156 ops" in str(exc.value)


@pytest.mark.parametrize("field,cfg", [
    ("pipeline.pp", _cfg(pp=limits.MAX_STAGES + 1)),
    ("pipeline.microbatches", _cfg(m=limits.MAX_MICROBATCHES + 1)),
    ("model.num_layers", _cfg(layers=limits.MAX_LAYERS + 1)),
    ("pipeline.vpp", _cfg(pp=limits.MAX_STAGES // 2, vpp=4, schedule="interleaved-1f1b")),
])
def test_counts_beyond_any_command_are_refused(field, cfg):
    with pytest.raises(UserError) as exc:
        limits.check_request(cfg, None)
    assert exc.value.field == field


def test_invalid_counts_are_left_to_the_configs_own_checks():
    assert limits.check_request(_cfg(pp=0), limits.SIMULATE) is None
    assert limits.check_request(_cfg(schedule="nope"), limits.SIMULATE) is None


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--pp", "256", "--microbatches", "65536", "--num-layers", "10000"],
     "33,554,432 ops"),
    (["simulate", "--pp", "1000000000"], "pipeline.pp"),
    (["simulate", "--microbatches", "1000000000"], "pipeline.microbatches"),
    (["simulate", "--num-layers", "1000000000"], "model.num_layers"),
    (["split", "--num-layers", "1000000000000"], "model.num_layers"),
    (["plan", "--num-layers", "100000000"], "model.num_layers"),
    (["plan", "--pp", "256", "--microbatches", "4096", "--num-layers", "10240",
      "--time-budget", "5"], "--time-budget"),
    (["simulate", "--pp", "64", "--microbatches", "4096", "--num-layers", "64", "--trace",
      "unused.json"], "drop --trace"),
])
def test_cli_refuses_before_building_anything(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "unused.json").exists()

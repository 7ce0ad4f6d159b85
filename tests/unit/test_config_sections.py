"""A key in the wrong section (TOML files a key under the last [table] header above it) is
refused naming the section it belongs in, not with the list of the keys valid where it
stands."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppsim.config.schema import HardwareConfig, PipelineConfig, config_from_dict
from ppsim.errors import UserError
from ppsim.pipeline.placement import PlacementConfig

# Each section's keys, read from the dataclasses the sections fill (and, for [memory], from
# docs/model.md's list: recompute_modules, recompute_layers, offload_modules,
# offload_fraction, offload_step_bytes).
HOMES = {"pipeline": {f.name for f in fields(PipelineConfig)},
         "hardware": {f.name for f in fields(HardwareConfig)},
         "placement": {f.name for f in fields(PlacementConfig)},
         "memory": {"recompute_modules", "recompute_layers", "offload_modules",
                    "offload_fraction", "offload_step_bytes"}}
MODEL = {"preset": "tiny-gpt"}


def _error(data: dict) -> UserError:
    with pytest.raises(UserError) as e:
        config_from_dict(data)
    return e.value


@given(st.sampled_from(sorted(HOMES)), st.sampled_from(["model", *sorted(HOMES)]),
       st.data())
def test_a_key_of_one_section_under_another_names_its_home(home: str, under: str,
                                                           data: st.DataObject) -> None:
    keys = sorted(k for k in HOMES[home] if under == "model" or k not in HOMES[under])
    if under == home or not keys:
        return
    key = data.draw(st.sampled_from(keys))
    if under == "model" and key in {"num_layers", "tp", "preset"}:
        return  # valid in [model] too
    tables = {"model": dict(MODEL)}
    tables.setdefault(under, {})[key] = 1
    err = _error(tables)
    assert err.field == f"{under}.{key}"
    assert f"[{home}]" in err.problem and f"[{home}]" in err.fix


def test_a_top_level_key_under_a_table_is_sent_back_above_the_headers() -> None:
    err = _error({"model": {**MODEL, "costs_file": "costs.json"}})
    assert err.field == "model.costs_file" and "top level" in err.problem
    assert "above the first [table] header" in err.fix


def test_a_section_key_at_the_top_level_is_sent_to_its_section() -> None:
    err = _error({"model": dict(MODEL), "microbatches": 8})
    assert err.field == "microbatches" and "[pipeline]" in err.problem


def test_a_typo_still_gets_the_closest_key() -> None:
    err = _error({"model": dict(MODEL), "pipeline": {"microbatch": 8}})
    assert err.field == "pipeline.microbatch" and "microbatches" in err.fix


def test_the_command_line_says_it_in_one_line(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\npp = 4\n')
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "simulate", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert r.stderr.strip() == ("ppsim simulate: error: model.pp: belongs in [pipeline], not "
                                "in [model] (move it under [pipeline])")

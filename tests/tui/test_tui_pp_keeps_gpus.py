"""A pp edit of a job given by its GPUs and global batch keeps the GPUs, as `--gpus N`
means to a Megatron user (dp = N / (tp x cp x pp)): the TUI's pp 8 is `ppsim simulate
... --pp 8`'s job, not one of twice the GPUs; the headline names the GPUs."""

from __future__ import annotations

import json

import pytest
from helpers import run_main

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.config.schema import Config
from ppsim.job.shape import job_shape
from ppsim.tui.app import PPSimApp
from ppsim.tui.editing import EditRefused
from ppsim.tui.headline import Headline, throughput_text
from ppsim.tui.session import (
    EditState,
    apply_setting,
    config_for,
    evaluate_state,
    state_from_config,
)
from ppsim.tui.testing import settle

JOB = ["--preset", "qwen3-30b-a3b", "--hardware", "h100-80gb", "--gpus", "64", "--ep", "8"]


def opened(*flags: str) -> tuple[Config, EditState]:
    """The config and state `ppsim tui FLAGS` opens on."""
    cfg = config_from_args(build_parser().parse_args(["tui", *JOB, *flags]))
    return cfg, state_from_config(cfg)


def shape_of(cfg: Config, state: EditState) -> tuple[int, int]:
    """(GPUs, global batch) of the job the state simulates."""
    shape = job_shape(config_for(cfg, state))
    assert shape is not None
    return shape.gpus, shape.global_batch_size


def test_a_pp_edit_keeps_the_gpus_and_is_simulates_job() -> None:
    cfg, state = opened("--pp", "4", "--global-batch-size", "512")
    assert (state.pp, state.dp, state.microbatches) == (4, 16, 32)
    edited = apply_setting(cfg, state, "pp", "8")
    assert (edited.pp, edited.dp, edited.microbatches) == (8, 8, 64)
    assert shape_of(cfg, edited) == (64, 512)
    code, out, _ = run_main(["simulate", *JOB, "--pp", "8", "--global-batch-size", "512",
                             "--json"])
    assert code == 0
    ref = json.loads(out)
    result = evaluate_state(cfg, edited)
    assert result.sim.summary.iteration_time_ms == ref["iteration_time_ms"]
    assert (ref["job"]["gpus"], ref["job"]["dp"]) == (64, 8)
    assert throughput_text(result).startswith("64 GPUs  ")
    assert throughput_text(result, compact=True).startswith("64 GPUs ")


@pytest.mark.parametrize("pp", range(1, 65))
def test_every_accepted_pp_keeps_the_gpus_and_the_batch(pp: int) -> None:
    cfg, state = opened("--pp", "4", "--global-batch-size", "512")
    try:
        edited = apply_setting(cfg, state, "pp", str(pp))
    except EditRefused as exc:
        assert exc.field == "pp" and 64 % pp  # every divisor of 64 runs 48 layers
        return
    assert edited.pp * edited.dp == 64 and edited.microbatches * edited.dp == 512
    if edited.dp >= 8:  # below, ep 8 does not fold into dp: the full check refuses it
        assert shape_of(cfg, edited) == (64, 512)


def test_a_pp_that_does_not_divide_is_refused_in_words() -> None:
    cfg, state = opened("--pp", "4", "--global-batch-size", "512")
    with pytest.raises(EditRefused) as gpus:
        apply_setting(cfg, state, "pp", "3")
    assert gpus.value.field == "pp"
    assert "world_size (64) is not divisible by 3" in gpus.value.reason
    assert "64 GPUs" in gpus.value.reason and "pp must divide 64" in gpus.value.reason
    cfg, state = opened("--pp", "4", "--global-batch-size", "48")  # dp 16, 3 microbatches
    with pytest.raises(EditRefused) as batch:
        apply_setting(cfg, state, "pp", "2")  # dp 32 does not divide 48
    assert batch.value.field == "pp"
    assert "global batch size (48) is not divisible by micro batch size (1) times data " \
        "parallel size (32)" in batch.value.reason


def test_without_a_global_batch_pp_keeps_dp_and_vpp_never_changes_it() -> None:
    cfg, state = opened("--pp", "4", "--microbatches", "32")
    edited = apply_setting(cfg, state, "pp", "8")
    assert (edited.dp, edited.microbatches) == (16, 32)
    assert shape_of(cfg, edited) == (128, 512)
    cfg, state = opened("--pp", "4", "--global-batch-size", "512")
    chunks = apply_setting(cfg, state, "vpp", "2")
    assert (chunks.dp, chunks.microbatches) == (16, 32)


async def test_pp_edit_refusal_and_undo_on_the_screen() -> None:
    cfg, state = opened("--pp", "4", "--global-batch-size", "512")
    app = PPSimApp(cfg)
    async with app.run_test(size=(160, 45)) as pilot:
        await settle(pilot)
        assert "64 GPUs" in app.query_one(Headline).render().plain
        for text in ("8", "3"):  # 8 is taken, 3 refused and the state kept
            inp = app.query_one("#set-pp")
            inp.focus()
            inp.value = ""
            await pilot.press(*text, "enter")
            await settle(pilot)
            assert (app.state.pp, app.state.dp, app.state.microbatches) == (8, 8, 64)
        assert "pp '3' refused, kept 8" in app.query_one("#status").text
        assert "64 GPUs" in app.query_one(Headline).render().plain
        app.query_one("#split-rows").focus()
        await pilot.press("u")
        await settle(pilot)
        assert app.state == state and app.result.state == state

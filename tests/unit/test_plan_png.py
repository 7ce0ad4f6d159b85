"""`ppsim plan --png`: the planned split's timeline above Megatron's even split's, and
with --gpus the best shape's, the picture `simulate --png` draws."""

from __future__ import annotations

import json
import re

from helpers import run_main
from PIL import Image

from ppsim.cli.picture import COLOURS


def colours(path) -> dict[tuple[int, int, int], int]:
    return {c: n for n, c in Image.open(path).convert("RGB").getcolors(1 << 20)}


def test_the_plan_draws_its_split_above_megatrons(tmp_path) -> None:
    planned, alone = tmp_path / "plan.png", tmp_path / "sim.png"
    code, out, err = run_main(["plan", "--time-budget", "5", "--png", str(planned)])
    assert code == 0, err
    assert f"timeline picture written to {planned}" in out
    code, _, err = run_main(["simulate", "--png", str(alone)])
    assert code == 0, err
    # The embedded default plans 7 + 1 against Megatron's 4 + 4: two panels of two lanes.
    assert Image.open(planned).height > Image.open(alone).height
    assert colours(planned)[COLOURS["F"]] > colours(alone)[COLOURS["F"]]


def test_the_job_plan_draws_the_best_shape(tmp_path) -> None:
    out_png = tmp_path / "job.png"
    code, out, err = run_main(["plan", "--preset", "llama3-8b", "--num-layers", "8",
                               "--hardware", "h100-80gb", "--gpus", "16",
                               "--global-batch-size", "32", "--use-distributed-optimizer",
                               "--time-budget", "3", "--json", "--png", str(out_png)])
    assert code == 0, err
    best = json.loads(out)["best"]  # stdout stays one JSON object
    assert best["dp"] > 1
    seen = colours(out_png)
    assert seen.get(COLOURS["F"], 0) > 0 and seen.get(COLOURS["D"], 0) > 0


def test_the_png_never_replaces_an_input(tmp_path) -> None:
    cfg = tmp_path / "job.toml"
    text = '[model]\npreset = "llama3-8b"\n[hardware]\npreset = "h100-80gb"\n'
    cfg.write_text(text)
    for job in ([], ["--gpus", "16", "--global-batch-size", "32"], ["--search", "policy"]):
        code, _, err = run_main(["plan", "--config", str(cfg), *job, "--png", str(cfg)])
        assert code == 2 and err.count("\n") == 1 and "--png" in err, err
        assert cfg.read_text() == text


def test_the_memory_policy_plan_draws_its_best_too(tmp_path) -> None:
    """`--search policy` plans elsewhere (ppsim.cli.plan_policy): its best split with its
    policy, above Megatron's even split with the configured one."""
    out_png, alone = tmp_path / "policy.png", tmp_path / "sim.png"
    code, out, err = run_main(["plan", "--search", "policy", "--time-budget", "5",
                               "--png", str(out_png)])
    assert code == 0, err
    assert f"timeline picture written to {out_png}" in out
    assert run_main(["simulate", "--png", str(alone)])[0] == 0
    assert Image.open(out_png).height > Image.open(alone).height


def test_a_faster_reference_that_does_not_fit_says_so(tmp_path, monkeypatch) -> None:
    """The policy plan at 50 GB recomputes; Megatron's even split with the configured
    (selective) recompute is faster but does not fit: the title said only "0.853x"."""
    from ppsim.cli import sim_picture

    titles: list[str] = []
    monkeypatch.setattr(sim_picture, "write_simulation_png",
                        lambda path, panels, title: titles.append(title))
    code, _, err = run_main(["plan", "--preset", "llama3-70b", "--hardware", "h100-80gb",
                             "--pp", "4", "--microbatches", "16", "--memory-gb", "50",
                             "--search", "policy", "--time-budget", "2",
                             "--png", str(tmp_path / "p.png")])
    assert code == 0, err
    planned, reference = (float(x) for x in re.findall(r"([0-9.]+) ms", titles[0]))
    assert reference < planned and "does not fit: peak " in titles[0], titles
    assert titles[0].endswith(" of 50.00 GB)"), titles


def test_a_reference_that_fits_is_not_marked(tmp_path, monkeypatch) -> None:
    from ppsim.cli import sim_picture

    titles: list[str] = []
    monkeypatch.setattr(sim_picture, "write_simulation_png",
                        lambda path, panels, title: titles.append(title))
    assert run_main(["plan", "--time-budget", "5", "--png", str(tmp_path / "p.png")])[0] == 0
    assert "Megatron even" in titles[0] and "fit" not in titles[0], titles

"""An infra engineer's pass over the less-used commands (in-process, seconds): what
`presets NAME` prints is a file `simulate` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_in_process


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    return run_in_process(capsys, argv)


@pytest.mark.parametrize("name", ["h100-80gb", "cpu"])
def test_a_hardware_presets_output_redirected_is_a_hardware_file(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ppsim presets h100-80gb > hw.toml` then `--hardware hw.toml`: the lines around
    the table are TOML comments, so the file prices as the preset does."""
    code, out, err = _run(capsys, ["presets", name])
    assert code == 0, err
    hw = tmp_path / "hw.toml"
    hw.write_text(out)
    job = ["simulate", "--preset", "tiny-gpt", "--pp", "2", "--json"]
    code, by_name, err = _run(capsys, [*job, "--hardware", name])
    assert code == 0, err
    code, by_file, err = _run(capsys, [*job, "--hardware", str(hw)])
    assert code == 0, err
    assert json.loads(by_file)["iteration_time_ms"] == json.loads(by_name)["iteration_time_ms"]


LLAMA = ["--preset", "llama3-8b", "--pp", "4", "--hardware", "h100-80gb"]


@pytest.mark.parametrize(("flags", "field"), [
    (["--fp8-format", "hybrid"], "fp8"),
    (["--no-bias-swiglu-fusion"], "bias_swiglu_fusion"),
    (["--grad-reduce-in-bf16"], "grad_reduce_in_bf16"),
    (["--optimizer", "muon"], "optimizer"),
    (["--normalization", "LayerNorm"], "norm"),
])
def test_a_cost_file_is_refused_for_a_job_it_does_not_price(
        flags: list[str], field: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`costs --json > c.json`, then `simulate --costs c.json` with FP8 (or another
    precision, fusion or optimizer) priced the file's bf16 job: 2621 ms where FP8 is 2093,
    with no word. A field that changes the pieces' time or bytes must match."""
    code, doc, err = _run(capsys, ["costs", *LLAMA, "--json"])
    assert code == 0, err
    costs = tmp_path / "c.json"
    costs.write_text(doc)
    code, _, err = _run(capsys, ["simulate", *LLAMA, *flags, "--costs", str(costs)])
    assert code == 2
    assert f"model.{field}:" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_cost_file_takes_the_same_job_spelled_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty norm or position means the MLP's (RMSNorm and rotary for a gated one):
    the preset's own Megatron spelling of them reads the file back."""
    code, doc, err = _run(capsys, ["costs", *LLAMA, "--json"])
    assert code == 0, err
    costs = tmp_path / "c.json"
    costs.write_text(doc)
    spelled = ["--normalization", "RMSNorm", "--position-embedding-type", "rope"]
    code, out, err = _run(capsys, ["simulate", *LLAMA, *spelled, "--costs", str(costs),
                                   "--json"])
    assert code == 0, err
    code, plain, err = _run(capsys, ["simulate", *LLAMA, "--json"])
    assert json.loads(out)["iteration_time_ms"] == json.loads(plain)["iteration_time_ms"]


def test_the_timeline_picture_names_its_colours(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`simulate --png` drew seven colours and named none (what is the brown block at the
    end of each lane?): under the time axis a swatch of each colour drawn, beside its name."""
    from PIL import Image

    from ppsim.cli.picture import COLOURS

    png = tmp_path / "t.png"
    code, _, err = _run(capsys, ["simulate", "--preset", "tiny-gpt", "--pp", "2",
                                 "--schedule", "zb-h1", "--png", str(png)])
    assert code == 0, err
    img = Image.open(png).convert("RGB")
    foot = img.crop((0, img.height - 24, img.width, img.height))
    counts = {colour: n for n, colour in foot.getcolors(img.width * 24)}
    for kind in "FBW":  # the ops, each a 10x10 swatch
        assert counts.get(COLOURS[kind], 0) >= 100, kind


def test_split_counts_the_decoder_layers_as_megatron_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3's split was titled "62 layers" above its own `--num-layers 61`: the
    MTP depth is named beside the decoder layers."""
    code, out, err = _run(capsys, ["split", "--preset", "deepseek-v3", "--pp", "8"])
    assert code == 0, err
    assert out.splitlines()[0].split() == ["61", "layers", "+", "1", "MTP", "on", "pp=8,",
                                           "vpp=1"]
    assert "--num-layers 61 " in out


def test_a_timeline_block_too_narrow_for_its_label_draws_none(tmp_path: Path) -> None:
    """Labels were drawn in any block over 14 px and the next block cut them short: B12
    in a 16 px block read "B1". A block draws its label only where it holds it whole."""
    from PIL import Image

    from ppsim.cli.picture import COLOURS, render_png

    png = tmp_path / "t.png"
    width, left, right = 1690, 70, 20  # 16 px a millisecond
    lane = [(0.0, 1.0, "F", 12), (1.0, 99.0, "B", 0)]
    render_png([("one", [lane])], str(png), width=width)
    img = Image.open(png).convert("RGB")
    scale = (width - left - right) / 100.0
    top = 14 + 16 + 20  # the title line, the panel's heading
    block = img.crop((left + 1, top + 2, int(left + scale) - 2, top + 20))
    assert {c for _, c in block.getcolors(1000)} == {COLOURS["F"]}
    wide = img.crop((int(left + scale) + 1, top + 2, int(left + scale) + 40, top + 20))
    assert any(min(c) > 180 for _, c in wide.getcolors(2000))  # B0 fits: its white label


def test_a_cost_file_edited_in_its_groups_alone_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`costs --json` lists the distinct pieces under `groups`, the place a user edits;
    the simulator reads `layers`, so the edit was simulated as if not made. Groups that
    disagree with the entries are refused; the entry edited (groups deleted) is read."""
    job = ["--preset", "tiny-gpt", "--pp", "2"]
    code, doc, err = _run(capsys, ["costs", *job, "--json"])
    assert code == 0, err
    data = json.loads(doc)
    data["groups"][0]["forward_ms"] *= 10
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    code, _, err = _run(capsys, ["simulate", *job, "--costs", str(edited)])
    assert code == 2
    assert "groups[0].forward_ms:" in err and err.count("\n") == 1
    data["layers"][0]["forward_ms"] *= 10
    del data["groups"]
    edited.write_text(json.dumps(data))
    code, out, err = _run(capsys, ["simulate", *job, "--costs", str(edited), "--json"])
    assert code == 0, err
    code, plain, err = _run(capsys, ["simulate", *job, "--json"])
    assert json.loads(out)["iteration_time_ms"] > json.loads(plain)["iteration_time_ms"]

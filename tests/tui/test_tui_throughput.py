"""Issue 24 item 4 on the TUI: the headline shows throughput in users' units (tokens/s
per GPU, TFLOP/s/GPU, MFU) equal to `ppsim simulate --json`'s `throughput`, whole at
80 and 160 columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import simulate_json

from ppsim.config.schema import DEFAULT_TOML, load_config
from ppsim.tui.app import PPSimApp
from ppsim.tui.headline import Headline
from ppsim.tui.testing import settle

LLAMA = """\
[model]
preset = "llama3-70b"

[pipeline]
pp = 8
microbatches = 64

[hardware]
preset = "h100-80gb"
"""


LLAMA_FP8 = LLAMA.replace('preset = "llama3-70b"', 'preset = "llama3-70b"\nfp8 = "hybrid"')
MIXTRAL_A2A = """\
[model]
preset = "mixtral-8x7b"
num_layers = 8
ep = 8
dp = 8

[pipeline]
pp = 2
vpp = 2
schedule = "interleaved-1f1b"
microbatches = 8
overlap_moe_expert_parallel_comm = true

[hardware]
preset = "h100-80gb"
"""


def shown_rate(t: dict, compact: bool, fp8: bool = False, a2a: bool = False,
               job: dict | None = None) -> str:
    """How the headline words `ppsim simulate --json`'s throughput (the CLI's formats),
    after the job's GPUs where they are more than its pipeline's ranks, and says FP8 when
    the job's matmuls are, A2A overlap under the combined 1F1B."""
    tokens = "tok/s/GPU" if compact else "tokens/s/GPU"
    sep = " " if compact else "  "
    gpus = f"{job['gpus']} GPUs{sep}" if job is not None and job["gpus"] > job["pp"] else ""
    # A CPU model's rate below 1 TFLOP/s to three figures, as `ppsim simulate` prints it
    # (the headline printed 0.0 there).
    tf = t["tflops_per_gpu"]
    rate = f"{tf:.1f}" if tf >= 1 else f"{tf:.3g}"
    return (f"{gpus}{t['tokens_per_s_per_gpu']:,.0f} {tokens}{sep}{rate} "
            f"TFLOP/s/GPU{sep}MFU {t['mfu']:.1%}" + (f"{sep}FP8" if fp8 else "")
            + (f"{sep}A2A overlap" if a2a else ""))


@pytest.mark.parametrize("text", [LLAMA, LLAMA_FP8, MIXTRAL_A2A, DEFAULT_TOML],
                         ids=["llama3-70b", "llama3-70b-fp8", "mixtral-a2a", "default"])
async def test_headline_throughput_is_simulates(text: str, tmp_path: Path) -> None:
    """At 80x24, then the same session resized to 160x45."""
    path = tmp_path / "job.toml"
    path.write_text(text)
    sim = simulate_json(path)
    ref, fp8 = sim["throughput"], sim["job"] is not None and sim["job"]["fp8"] is not None
    a2a = sim["job"] is not None and sim["job"]["ep_overlap"]
    assert ref is not None and ref["tflops_per_gpu"] >= 0
    full, compact = (shown_rate(ref, c, fp8, a2a, sim["job"]) for c in (False, True))
    app = PPSimApp(load_config(str(path)), config_path=str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        for size in ((80, 24), (160, 45)):
            await pilot.resize_terminal(*size)
            await settle(pilot)
            assert (app.size.width, app.size.height) == size
            head = app.query_one(Headline)
            lines = head.render().plain.splitlines()
            width = head.size.width - 2
            # at the end of the first line when it has room, else first on the second
            assert lines[0].endswith((full, compact)) or lines[1].startswith((full, compact)), \
                size
            if width < 100:
                assert lines[1].startswith(compact), size
            assert all(len(line) <= width for line in lines), size  # nothing past the edge


async def test_a_uniform_model_shows_no_throughput(tmp_path: Path) -> None:
    path = tmp_path / "u.toml"
    path.write_text('[model]\nkind = "uniform"\nnum_layers = 8\nforward_ms = 1.0\n'
                    'backward_ms = 2.0\n\n[pipeline]\npp = 2\nmicrobatches = 4\n')
    assert simulate_json(path)["throughput"] is None
    app = PPSimApp(load_config(str(path)))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "TFLOP/s" not in app.query_one(Headline).render().plain

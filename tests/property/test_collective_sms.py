"""A data-parallel collective hidden behind compute holds NCCL's SMs from it: each
millisecond hidden costs collective_sms / sm_count of a millisecond (the H100 preset:
16 of 132, NVIDIA/nccl issues 689 and 1453)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.job.collectives import behind_compute_ms
from ppsim.job.model import build_job

ms = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
share = st.floats(min_value=0.0, max_value=1.0)


@settings(max_examples=300, deadline=None)
@given(comm=ms, window=ms, floor=ms, sm_share=share)
def test_hidden_collectives_cost_their_sm_share_and_never_more_than_waiting(
        comm: float, window: float, floor: float, sm_share: float) -> None:
    got = behind_compute_ms(comm, window, sm_share, floor)
    waited = min(comm, max(floor, comm - window))
    hidden = comm - waited
    assert hidden <= window + 1e-9
    assert got == pytest.approx(waited + sm_share * hidden, abs=1e-9)
    # Never cheaper than what nothing hides, never dearer than waiting for all of it.
    assert waited - 1e-9 <= got <= comm + 1e-9
    assert behind_compute_ms(comm, window, 0.0, floor) == pytest.approx(waited, abs=1e-9)
    assert behind_compute_ms(comm, window, 1.0, floor) == pytest.approx(comm, abs=1e-9)


def _job(sms: int | None, overlap: bool = True):
    hw = {"preset": "h100-80gb"} | ({} if sms is None else {"collective_sms": sms})
    return build_job(config_from_dict({
        "model": {"preset": "llama3-8b", "num_layers": 4, "dp": 16,
                  "distributed_optimizer": True},
        "pipeline": {"pp": 1, "microbatches": 4, "overlap_grad_reduce": overlap,
                     "overlap_param_gather": overlap},
        "hardware": hw}))


@settings(max_examples=40, deadline=None)
@given(sms=st.integers(min_value=0, max_value=131),
       window=st.floats(min_value=0.0, max_value=2000.0))
def test_the_step_pays_the_share_of_what_its_windows_hide(sms: int, window: float) -> None:
    params = 1_000_000_000
    alone, shared = _job(0), _job(sms)
    assert alone is not None and shared is not None
    free = alone.tail(params, window, window, 0.0).reduce_ms
    paid = shared.tail(params, window, window, 0.0).reduce_ms
    waiting = _job(0, overlap=False)
    assert waiting is not None
    total = waiting.tail(params, window, window, 0.0).reduce_ms
    # What the two windows hide of the reduce-scatter and the gather is total - free.
    assert paid == pytest.approx(free + sms / 132 * (total - free), rel=1e-9)


def test_the_h100_preset_holds_nccls_sixteen_channels() -> None:
    job = _job(None)
    assert job is not None and job.collective_sm_share == 16 / 132
    assert job.describe()["collective_sm_share"] == 16 / 132


@pytest.mark.parametrize("sms, message", [
    (132, "hardware.collective_sms: must be between 0 and 131"),
    (-1, "hardware.collective_sms: must be between 0 and 131"),
])
def test_more_sms_than_the_gpu_has_are_refused(tmp_path, capsys, sms: int,
                                               message: str) -> None:
    config = tmp_path / "job.toml"
    config.write_text('[model]\npreset = "llama3-8b"\n'
                      f'[hardware]\npreset = "h100-80gb"\ncollective_sms = {sms}\n')
    assert main(["simulate", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert message in err and "fewer than sm_count" in err, err
    assert len(err.strip().splitlines()) == 1, err

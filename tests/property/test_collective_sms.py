"""Communication hidden behind compute holds SMs from it: each millisecond of a
data-parallel collective hidden costs collective_sms / sm_count of a millisecond (the H100
preset: 16 of 132, NVIDIA/nccl issues 689 and 1453), and each of TE's userbuffers
reduce-scatters 16 / sm_count (ppsim.job.userbuffers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.job.collectives import behind_compute_ms
from ppsim.job.model import build_job
from ppsim.job.userbuffers import TpTraffic, overlapped_ms

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


@settings(max_examples=300, deadline=None)
@given(gathers=ms, scatters=ms, pipelined=st.floats(min_value=0.0, max_value=1.0),
       compute=ms, sms=st.sampled_from([0, 108, 132]))
def test_userbuffers_wait_for_the_last_chunk_and_pay_the_scatters_sms(
        gathers: float, scatters: float, pipelined: float, compute: float,
        sms: int) -> None:
    """TE's userbuffers under --tp-comm-overlap (ppsim.job.userbuffers): the last of 4
    chunks of a pipelined reduce-scatter always waits; the compute hides the rest as far
    as it lasts, paying 16 SMs' share of what it hides of the scatters."""
    t = TpTraffic(gathers_ms=gathers, scatters_ms=scatters, pipelined_ms=pipelined * scatters)
    got = overlapped_ms(t, compute, sms)
    tail = t.pipelined_ms / 4
    rest = t.total_ms - tail
    waited = tail + max(0.0, rest - compute)
    hidden = rest - max(0.0, rest - compute)
    scatter_share = (scatters - tail) / rest if rest > 0 else 0.0
    share = 16 / sms if sms else 0.0
    assert got == pytest.approx(waited + share * hidden * scatter_share, abs=1e-9)
    assert tail - 1e-9 <= got <= t.total_ms + 1e-9
    assert overlapped_ms(t, 0.0, sms) == pytest.approx(t.total_ms, abs=1e-9)
    assert overlapped_ms(t, compute + 1.0, sms) <= got + 1e-9

"""`ppsim run` with a memory policy (real gloo ranks): the measured activation peaks
against `simulate`'s for the same policy (losses and gradients against a single process
without one: test_executor.py's pooled checks cover these cases too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import between_ops_peaks

pytest.importorskip("torch")

from launch_cases import (  # noqa: E402
    HYBRID_HALVES,
    HYBRID_POLICY,
    INTERLEAVED,
    MLA_CONFIG,
    MLA_POLICY,
    MOE_CONFIG,
    MOE_POLICY,
    NORM_POLICY,
    ONE_F_ONE_B,
    POLICY,
    V,
)
from launches import Pool  # noqa: E402

pytestmark = pytest.mark.e2e
CASES = {"1f1b-policy": ONE_F_ONE_B, "interleaved-policy": INTERLEAVED,
         "zbv-policy": ["--schedule", "zbv", *V, "--microbatches", "4"],
         "moe-interleaved-policy": [*INTERLEAVED, *MOE_CONFIG],
         "mla-1f1b-policy": [*ONE_F_ONE_B, *MLA_CONFIG],
         "hybrid-1f1b-policy": [*HYBRID_HALVES, *ONE_F_ONE_B]}
"""Each policy launch's flags without the policy."""
POLICIES = {"1f1b-policy": POLICY, "interleaved-policy": POLICY, "zbv-policy": NORM_POLICY,
            "moe-interleaved-policy": MOE_POLICY, "mla-1f1b-policy": MLA_POLICY,
            "hybrid-1f1b-policy": HYBRID_POLICY}
PLAIN = {"1f1b-policy": "1f1b", "interleaved-policy": "interleaved", "zbv-policy": "zbv",
         "moe-interleaved-policy": "moe-interleaved-config", "mla-1f1b-policy": "mla-1f1b-config",
         "hybrid-1f1b-policy": "hybrid-1f1b"}


def _peaks(trace: Path, pp: int) -> list[int]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [max(e["args"]["activations"] for e in events
                if e.get("ph") == "C" and e["pid"] == r) for r in range(pp)]


def _simulated(argv: list[str], tmp: Path) -> list[int]:
    return between_ops_peaks([a.format(tmp=tmp) for a in argv])  # what the trace samples


@pytest.mark.parametrize("case", list(CASES))
def test_policy_peaks_are_predicted_within_2_percent(case: str, launches: Pool) -> None:
    """Every rank's measured activation peak within 2 % of the simulated one: a stage's
    input held until its B, a sent output freed (Megatron's deallocate_output_tensor)."""
    run = launches.get(case)
    got = _peaks(run.tmp / "out" / "trace.json", 2)
    want = _simulated([*CASES[case], *POLICIES[case]], run.tmp)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= 0.02 * w, (got, want)


@pytest.mark.parametrize("case", list(PLAIN.values()))
def test_plain_peaks_are_predicted_within_2_percent(case: str, launches: Pool) -> None:
    """The same without a policy (the pooled launches the policy runs are compared to)."""
    argv = {v: CASES[k] for k, v in PLAIN.items()}[case]
    run = launches.get(case)
    got = _peaks(run.tmp / "out" / "trace.json", 2)
    want = _simulated(argv, run.tmp)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= 0.02 * w, (got, want)


@pytest.mark.parametrize("case", list(CASES))
def test_a_policy_lowers_every_ranks_measured_peak(case: str, launches: Pool) -> None:
    """Offload and recompute free activations on every rank, as simulated."""
    pp = 2
    run = launches.get(case)
    policy = _peaks(run.tmp / "out" / "trace.json", pp)
    plain = _peaks(launches.get(PLAIN[case]).tmp / "out" / "trace.json", pp)
    sim_policy = _simulated([*CASES[case], *POLICIES[case]], run.tmp)
    sim_plain = _simulated(CASES[case], run.tmp)
    for r in range(pp):
        assert policy[r] < plain[r] and sim_policy[r] < sim_plain[r]

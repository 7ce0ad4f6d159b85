"""Hybrid layer patterns: parsed and refused as Megatron-LM does, `|` as the split, the
piped pattern as the export, the hybrid presets' parameter counts."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.config.presets import MODEL_PRESETS
from ppsim.config.schema import config_from_dict
from ppsim.costs.costfile import cost_document
from ppsim.costs.hybrid import parse_pattern, with_pipes
from ppsim.costs.kinds import model_params
from ppsim.errors import UserError
from ppsim.pipeline.hybrid_exports import piped_pattern
from ppsim.pipeline.problem import build_problem, model_costs, resolve_split
from ppsim.pipeline.split import Split

# --- Megatron's rules, restated (not imported) ---------------------------------------------
# Megatron-LM d98e8a6, megatron/core/models/hybrid/hybrid_layer_allocation.py:
# parse_hybrid_pattern and _validate_pattern.
LAYER_SYMBOLS = frozenset("MG*D+-E")


def _megatron_validate(part: str, pipes_allowed: bool) -> None:
    allowed = LAYER_SYMBOLS | ({"|"} if pipes_allowed else set())
    if not set(part) <= allowed:
        raise ValueError("not a valid layer symbol")
    if "*" in part and ("D" in part or "+" in part):
        raise ValueError("Not supported to have both Attention and MLA/DSA in one model")


def megatron_parse(pattern: str) -> tuple[str | None, str | None, int]:
    """(main_pattern, mtp_pattern, mtp_num_depths) as Megatron returns them."""
    parts = pattern.split("/")
    if len(parts) == 1:
        _megatron_validate(parts[0], True)
        return parts[0], None, 0
    main = parts[0]
    if main:
        _megatron_validate(main, True)
    depths = parts[1:]
    if not any(depths):
        return main or None, None, 0
    if any(d != depths[0] for d in depths):
        raise ValueError("All MTP patterns must be identical")
    _megatron_validate(depths[0], False)
    return main or None, depths[0], len(depths)


SYMBOLS = "MG*D+-E"
valid_main = st.text(alphabet=SYMBOLS + "|", max_size=10)
structured = st.builds(lambda main, mtp, n: main + ("/" + mtp) * n,
                       valid_main, st.text(alphabet=SYMBOLS, max_size=3), st.integers(0, 3))
anything = st.text(alphabet=SYMBOLS + "|/x ", max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.one_of(structured, anything))
def test_parse_accepts_and_refuses_exactly_what_megatron_does(pattern):
    try:
        want = megatron_parse(pattern)
    except ValueError:
        with pytest.raises(UserError) as exc:
            parse_pattern(pattern)
        assert exc.value.field == "model.hybrid_layer_pattern"
        return
    got = parse_pattern(pattern)
    main, mtp, depths = want
    assert "|".join(got.segments) == (main or "")
    assert (got.mtp or None, got.mtp_depths) == (mtp, depths)
    # Megatron's --num-layers: the main pattern's symbols, pipes not counted.
    assert len(got.kinds) == len((main or "").replace("|", ""))


@pytest.mark.parametrize("pattern, main, mtp, depths", [
    # The examples of Megatron's parse_hybrid_pattern docstring.
    ("M*M*", "M*M*", None, 0),
    ("M*M*/MM/MM", "M*M*", "MM", 2),
    ("MMMM/*M/*M/*M", "MMMM", "*M", 3),
    ("M-M-|M-M*-/MM/MM", "M-M-|M-M*-", "MM", 2),
    ("M*M*/", "M*M*", None, 0),  # only empty MTP parts: no MTP
    ("M*//", "M*", None, 0),
    ("M*/+E", "M*", "+E", 1),  # attention and MLA are checked per pattern, not together
])
def test_megatron_docstring_examples(pattern, main, mtp, depths):
    assert megatron_parse(pattern) == (main, mtp, depths)  # the restatement itself
    got = parse_pattern(pattern)
    assert ("|".join(got.segments), got.mtp or None, got.mtp_depths) == (main, mtp, depths)


@pytest.mark.parametrize("pattern, says", [
    ("M*X", "'X' is not a layer symbol"),
    ("M*+", "mixes attention"),
    ("MD*-", "mixes attention"),
    ("M*/MM/M", "MTP pattern 2"),
    ("M*//MM", "MTP pattern 2"),
    ("MM/M|/M|", "'|' is not a layer symbol"),  # no pipes in the MTP pattern
    ("M-/+*", "mixes attention"),
])
def test_megatron_error_cases_are_refused_naming_the_field(pattern, says):
    with pytest.raises(ValueError):
        megatron_parse(pattern)
    with pytest.raises(UserError) as exc:
        parse_pattern(pattern)
    assert exc.value.field == "model.hybrid_layer_pattern" and says in exc.value.problem


# --- `|` is the split, in Megatron's segment order ------------------------------------------


def _cfg(pattern: str, pp: int, **pipeline):
    return config_from_dict({"model": {"preset": "tiny-hybrid", "hybrid_layer_pattern": pattern},
                             "pipeline": {"pp": pp, **pipeline}})


def megatron_segment(main: str, pp: int, rank: int, vp: int) -> tuple[str, int]:
    """Megatron's select_pipeline_segment with pipes: (segment, layer offset)."""
    segments = main.split("|")
    index = vp * pp + rank
    return segments[index], sum(len(s) for s in segments[:index])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.data())
def test_pipes_give_megatrons_segments_to_each_rank_and_chunk(pp, vpp, data):
    assume(pp > 1 or vpp == 1)  # Megatron refuses vpp > 1 on one rank
    segs = [data.draw(st.text(alphabet="M-*G", max_size=4)) for _ in range(pp * vpp)]
    main = "|".join(segs)
    if not main.replace("|", ""):
        segs[0] = main = "M" + main
    split = resolve_split(_cfg(main, pp))
    assert (split.pp, split.vpp) == (pp, vpp)
    for st_ in split.stages:
        seg, offset = megatron_segment(main, pp, st_.rank, st_.chunk)
        assert (st_.layers, st_.offset) == (len(seg), offset)


@pytest.mark.parametrize("pattern, pp, pipeline, field", [
    ("M-*-|G-E-|M-", 2, {}, "model.hybrid_layer_pattern"),  # 3 segments over pp 2
    ("M-*-|G-E-", 1, {}, "model.hybrid_layer_pattern"),  # vpp 2 on pp 1
    ("M-*-|G-E-", 2, {"first_stage_layers": 3}, "model.hybrid_layer_pattern"),
    ("M-*-|G-E-", 2, {"layout": "Et*4|t*4L"}, "model.hybrid_layer_pattern"),
    ("M-*-|G-E-", 2, {"account_for_loss": True}, "model.hybrid_layer_pattern"),
    ("M-*-|G-E-", 2, {"split": [5, 3]}, "model.hybrid_layer_pattern"),
    ("M-|*-|G-|E-", 2, {"vpp": 4}, "pipeline.vpp"),  # 4 segments = 2 per rank
])
def test_what_megatron_refuses_beside_a_pattern(pattern, pp, pipeline, field):
    with pytest.raises(UserError) as exc:
        resolve_split(_cfg(pattern, pp, **pipeline))
    assert exc.value.field == field


def test_a_pattern_without_pipes_takes_any_split_and_exports_the_pipes(capsys):
    assert main(["split", "--preset", "tiny-hybrid", "--pp", "2", "--vpp", "2", "--split",
                 "3,1,2,2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hybrid_layer_pattern"] == "M-*|-|G-|E-"  # Megatron reads vpp 2 from it
    assert main(["split", "--preset", "tiny-hybrid", "--schedule", "zbv", "--pp", "2",
                 "--vpp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["megatron_flags"] is None and "loop" in out["megatron_note"]


def test_four_segments_on_two_ranks_run_interleaved():
    problem = build_problem(_cfg("M-|*-|G-|E-", 2, schedule="1f1b"))
    assert problem.split.vpp == 2 and problem.schedule.name == "interleaved-1f1b"
    assert problem.split.counts == (2, 2, 2, 2)


def test_pattern_sets_num_layers_and_mtp_as_megatron_derives_them():
    m = parse_model({"preset": "tiny-hybrid", "num_layers": 3, "hybrid_layer_pattern": "M*-E/*-"})
    assert (m.num_layers, m.mtp_layers) == (4, 1)
    costs = build_problem(_cfg("M*-E/*-", 2)).costs
    assert costs.kinds == ("mamba", "attention", "mlp", "moe-mlp", "mtp")
    with pytest.raises(UserError, match="layers"):
        parse_model({"preset": "tiny-hybrid", "layers": "dense*4"})


# --- The export: the pattern with `|` where the split's stages end ---------------------------


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="MG*-E", min_size=1, max_size=10), st.integers(0, 2),
       st.integers(1, 3), st.integers(1, 2), st.data())
def test_piped_export_reads_back_as_the_same_split(main, mtp, pp, vpp, data):
    assume(pp > 1 or vpp == 1)
    total, stages = len(main) + mtp, pp * vpp
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=stages - 1,
                                     max_size=stages - 1)))
    counts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True))
    if counts[-1] < mtp:
        return
    pattern = parse_pattern(main + ("/*-" * mtp))
    split = Split(counts, pp, vpp, "loop", mtp)
    piped = piped_pattern(pattern, split)
    again = parse_pattern(piped)
    assert again.main == main and (again.mtp, again.mtp_depths) == (pattern.mtp, mtp)
    assert len(again.segments) == stages
    back = resolve_split(config_from_dict({"model": {"preset": "tiny-hybrid",
                                                     "hybrid_layer_pattern": piped},
                                           "pipeline": {"pp": pp}}))
    assert back.counts == counts


def test_export_refuses_what_a_pattern_cannot_say():
    p = parse_pattern("M-*-G-E-/*-")
    with pytest.raises(UserError, match="MTP"):
        piped_pattern(p, Split((7, 0, 2, 0), 2, 2, "loop", 1))
    with pytest.raises(UserError, match="loop"):
        piped_pattern(p, Split((3, 2, 2, 2), 2, 2, "v", 1))
    with pytest.raises(UserError, match="pp >= 2"):
        piped_pattern(p, Split((5, 4), 1, 2, "loop", 1))
    with pytest.raises(UserError):
        with_pipes(p, (3, 3), 0)  # covers 6 of 8 layers


def test_split_and_plan_export_the_piped_pattern(capsys):
    assert main(["split", "--preset", "tiny-hybrid", "--hybrid-layer-pattern", "M-*-|G-E-",
                 "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["layers"] for s in out["stages"]] == [4, 4]
    assert out["hybrid_layer_pattern"] == "M-*-|G-E-"
    assert "--pipeline-model-parallel-layout" not in out["megatron_flags"]
    assert "--hybrid-layer-pattern 'M-*-|G-E-'" in out["megatron_flags"]
    assert main(["plan", "--preset", "tiny-hybrid", "--pp", "2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    segments = parse_pattern(best["hybrid_layer_pattern"]).segments
    assert [len(s) for s in segments] == best["split"]


def test_a_hybrid_split_has_no_layout_to_paste(capsys):
    """Megatron asserts "--pipeline-model-parallel-layout should not be used with
    --hybrid-layer-pattern" (arguments.py): the layout line ppsim printed for a hybrid
    stack's split was one Megatron stops at; the pattern with | is its only form."""
    assert main(["split", "--preset", "tiny-hybrid", "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["megatron_layout"] is None
    assert "--hybrid-layer-pattern" in out["megatron_layout_note"]
    assert main(["split", "--preset", "tiny-hybrid", "--pp", "2"]) == 0
    text = capsys.readouterr().out
    layout = [line for line in text.splitlines() if line.startswith("layout:")]
    assert len(layout) == 1 and "--pipeline-model-parallel-layout '" not in layout[0]
    assert "n/a" in layout[0]


def test_layers_per_virtual_stage_are_refused_beside_a_pattern(capsys):
    """Megatron asserts --num-layers-per-virtual-pipeline-stage away beside a pattern (its
    | segments give the virtual stages); ppsim took it and planned vpp from it."""
    assert main(["simulate", "--preset", "tiny-hybrid", "--pp", "2",
                 "--num-layers-per-virtual-pipeline-stage", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ppsim simulate: error: --num-layers-per-virtual-pipeline-stage: should not be used "
        "with --hybrid-layer-pattern")


def test_bad_pattern_on_the_command_line_is_one_line_exit_2(capsys):
    assert main(["simulate", "--preset", "tiny-hybrid", "--hybrid-layer-pattern", "M*+"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.hybrid_layer_pattern" in err[0]


# --- Presets: parameter counts within 2 % of the model cards --------------------------------


@pytest.mark.parametrize("name, total, source", [
    # NVIDIA Nemotron-H (arXiv 2504.03624) and the Megatron Bridge model page: 8B, 56B.
    ("nemotron-h-8b", 8e9, "arXiv 2504.03624"),
    ("nemotron-h-56b", 56e9, "arXiv 2504.03624"),
    # Qwen/Qwen3-Next-80B-A3B model card: 80B in total (MTP not counted).
    ("qwen3-next-80b-a3b", 80e9, "Qwen/Qwen3-Next-80B-A3B model card"),
])
def test_hybrid_preset_parameter_counts_match_model_cards(name, total, source):
    arch = parse_model({"preset": name}).arch  # type: ignore[union-attr]
    counts = model_params(arch)
    got, active = counts.total, counts.active
    assert got == pytest.approx(total, rel=0.02), source
    if name.startswith("nemotron"):
        assert active == pytest.approx(got, rel=1e-4)  # dense: every matmul weight, all norms aside
    else:
        # "3B activated": the card's rounded figure counts no embedding table.
        assert active - 2 * arch.vocab_size * arch.hidden_size == pytest.approx(3e9, rel=0.1)


def test_nemotron_3_nano_counts_match_its_report():
    """NVIDIA's Nemotron 3 Nano report: 31.6B parameters, 3.2B active a token (3.6B with
    the embedding table); 23 Mamba-2, 23 MoE and 6 attention layers."""
    arch = parse_model({"preset": "nemotron-3-nano-30b-a3b"}).arch  # type: ignore[union-attr]
    counts = model_params(arch)
    total, active = counts.total, counts.active
    assert total == pytest.approx(31.6e9, rel=0.01)
    assert active == pytest.approx(3.6e9, rel=0.02)
    assert active - arch.vocab_size * arch.hidden_size == pytest.approx(3.2e9, rel=0.02)
    kinds = parse_pattern(MODEL_PRESETS["nemotron-3-nano-30b-a3b"]["hybrid_layer_pattern"]).kinds
    assert tuple(kinds.count(k) for k in ("mamba", "moe-mlp", "attention")) == (23, 23, 6)


def test_qwen3_5_counts_match_its_name_and_megatrons_config():
    """Qwen3.5-397B-A17B: 397B parameters, 17B active a token (the name); Megatron-LM's
    MIMO example (get_qwen35_language_model_config) builds 60 layers, a full attention
    after every three GatedDeltaNet, each with a MoE of 512 experts."""
    arch = parse_model({"preset": "qwen3.5-397b-a17b"}).arch  # type: ignore[union-attr]
    counts = model_params(arch)
    assert counts.total == pytest.approx(397e9, rel=0.01)
    assert counts.active == pytest.approx(17e9, rel=0.03)  # the embedding table counted
    kinds = parse_pattern(MODEL_PRESETS["qwen3.5-397b-a17b"]["hybrid_layer_pattern"]).kinds
    assert tuple(kinds.count(k) for k in ("gdn", "attention", "moe-mlp")) == (45, 15, 60)


def test_nemotron_h_layer_mix_matches_its_paper():
    # arXiv 2504.03624: 8B has 24 Mamba-2, 24 MLP and 4 attention layers; 56B 54, 54, 10.
    for name, want in (("nemotron-h-8b", (24, 24, 4)), ("nemotron-h-56b", (54, 54, 10))):
        kinds = parse_pattern(MODEL_PRESETS[name]["hybrid_layer_pattern"]).kinds
        assert tuple(kinds.count(k) for k in ("mamba", "mlp", "attention")) == want


def test_num_layers_flag_beside_a_pattern_is_ignored_with_a_warning(capsys):
    assert main(["split", "--preset", "tiny-hybrid", "--num-layers", "6", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_layers"] == 8
    assert "--num-layers 6 ignored" in captured.err


def test_a_cost_file_serves_the_pattern_it_measured_wherever_the_pipes_fall(tmp_path, capsys):
    measured = parse_model({"preset": "tiny-hybrid"})
    doc = cost_document(model_costs(_cfg("M-*-G-E-", 2)), source="test",
                        model=measured.fields())
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(doc))
    common = ["simulate", "--preset", "tiny-hybrid", "--costs", str(path), "--pp", "2", "--json"]
    assert main([*common, "--hybrid-layer-pattern", "M-*-|G-E-"]) == 0
    capsys.readouterr()
    # Same length, other layers: the file's numbers would mislead.
    assert main([*common, "--hybrid-layer-pattern", "MMMM-*-E"]) == 2
    assert "model.hybrid_layer_pattern" in capsys.readouterr().err


def test_split_shows_each_stage_as_its_piece_of_the_pattern(capsys):
    assert main(["split", "--preset", "tiny-hybrid", "--hybrid-layer-pattern", "M-*-G-E-/*E",
                 "--pp", "2", "--split", "4,5"]) == 0
    out = capsys.readouterr().out
    assert "layers 0..3: M-*-" in out and "layers 4..8: G-E-/" in out

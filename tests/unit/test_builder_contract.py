"""A builder of one's own that breaks its contract (README, 'Your own model') is refused
before any process starts: exit 2, one line naming the member and the fix. Broken, each
failed inside the ranks blaming what tripped over it, or trained silently on targets
drawn apart from their inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.cli.main import main

BUILDER = '''
import random
import torch
import torch.nn.functional as F
from torch import nn

H, V, MISTAKE = 16, 32, {mistake!r}


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H if MISTAKE != "layer" else 2 * H)

    def forward(self, x):
        return self.lin(x) if MISTAKE == "layer" else x + self.lin(x)


class B:
    num_layers = 8
    activation_shape = (2, 8, 2 * H if MISTAKE == "shape" else H)
    dtype = "float32" if MISTAKE == "dtype" else torch.float32

    def embedding(self):
        return nn.Embedding(V, H)

    def layer(self, i):
        return Layer()

    def head(self):
        return nn.Linear(H, V)

    def microbatch(self, seed, iteration, index):
        draw = random.randrange(1 << 30) if MISTAKE == "random" else seed + index
        ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(draw))
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(self, out, targets):
        if MISTAKE == "float":
            return 1.0
        return F.cross_entropy(out.flatten(0, 1), targets.flatten(),
                               reduction="none" if MISTAKE == "vector" else "mean")


def build(fields):
    return B()
'''

CASES = {  # mistake: (words the one line holds)
    "shape": ("activation_shape", "(2, 8, 16)", "(2, 8, 32)"),
    "layer": ("layer(0) returns (2, 8, 32)", "activation_shape"),
    "dtype": ("dtype is 'float32'", "torch.dtype"),
    "vector": ("loss(output, targets) returns a tensor of shape (16,)", "mean loss"),
    "float": ("loss(output, targets) returns a float", "scalar"),
    "random": ("microbatch(0, 0, 0) returned other tensors", "pure function"),
}


def _builder(tmp_path: Path, mistake: str) -> str:
    path = tmp_path / f"own_{mistake}.py"
    path.write_text(BUILDER.format(mistake=mistake))
    return f"{path}:build"


@pytest.mark.parametrize("mistake", sorted(CASES))
def test_a_builder_breaking_its_contract_is_refused_before_the_ranks_start(
        mistake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    command, *rest = ["profile", "--out", "c.json"] if mistake == "layer" \
        else ["run", "--iterations", "1"]  # profile checks it too
    assert main([command, "--model", _builder(tmp_path, mistake), *rest]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "note: loading" not in ln]
    assert len(err) == 1 and err[0].startswith(f"ppsim {command}: error: --model: "), err
    assert all(w in err[0] for w in CASES[mistake]), err[0]
    assert not (tmp_path / "ppsim-run" / "latest").exists()


def test_a_builder_keeping_its_contract_passes_the_check(tmp_path: Path) -> None:
    from ppsim.cli.builder_checks import check_own_contract
    from ppsim.executor.builders import load_builder

    check_own_contract(load_builder(_builder(tmp_path, ""), {}), "--model")


@pytest.mark.parametrize("named", ["flag", "config"])
def test_profile_refuses_a_builder_that_raises_or_breaks_its_contract_in_its_name(
        named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """profile loaded a --model builder unguarded (a traceback where it raised) and one
    the config names not at all (the measuring processes failed on its shapes)."""
    monkeypatch.chdir(tmp_path)
    if named == "flag":
        raiser = tmp_path / "raiser.py"
        raiser.write_text("def build(fields):\n    raise KeyError('hidden_size')\n")
        argv, words = ["--model", f"{raiser}:build"], ("--model: building the model "
                                                       "failed: KeyError: 'hidden_size'",)
    else:
        cfg = tmp_path / "own.toml"
        cfg.write_text(f'[model]\nkind = "transformer"\npreset = "tiny-gpt"\n'
                       f'builder = "{_builder(tmp_path, "shape")}"\n')
        argv, words = ["--config", str(cfg)], ("model.builder: ", "activation_shape")
    assert main(["profile", *argv, "--out", "c.json"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "note: loading" not in ln]
    assert len(err) == 1 and err[0].startswith("ppsim profile: error: "), err
    assert all(w in err[0] for w in words), err[0]
    assert not (tmp_path / "c.json").exists()

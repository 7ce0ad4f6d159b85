"""What every rank of `ppsim run` needs, as a small JSON file the launcher writes.

`ppsim run` resolves the config (file, preset and flags) and every run setting
once, writes them into the run's folder (ppsim.executor.rundir.spec_path), and each rank
runs the worker on it (`python -P -m ppsim.executor.worker --spec PATH` in a printed
launch; torchrun forks it when `ppsim run` launches). Ranks parse no flags, so the
executor needs nothing from the command layer, and a printed torchrun command
or Slurm script runs exactly what `ppsim run` would have.

Imports no torch: the launcher writes the spec before any rank starts.
"""

from __future__ import annotations

import difflib
import json
import math
import types
import typing
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Literal

from ppsim.config.schema import Config, config_from_dict
from ppsim.errors import UserError
from ppsim.fileio import write_json_atomic
from ppsim.pipeline.problem import Problem, build_problem

FORMAT = "ppsim-run-spec/1"
"""The file's `format` key: a file of another format is refused, not guessed at."""
MAX_BYTES = 16 << 20
"""A spec holds a config and a few settings; anything larger is not one."""


@dataclass(kw_only=True)
class RunSpec:
    config: dict[str, Any]
    """The run's config with every flag applied, as `config_to_dict` writes it."""
    versus: dict[str, Any] | None = None
    """--versus: the config of the split run alternately with the run's own (None: none)."""
    builder: str
    """The model builder, `module:function` (--model, else [model] builder, else the GPT)."""
    builder_root: str | None = None
    """The folder `ppsim run` imported the builder's module from (a `module:function`
    of the user's): the worker looks there last for it."""
    dp: int
    """Data-parallel replicas of the pipeline: world = pp x dp."""
    device: Literal["cpu", "cuda"]
    """Where each rank computes; the worker picks the backend (gloo or NCCL) from it."""
    engine: Literal["ppsim", "torch"]
    """ppsim's runtime, or torch.distributed.pipelining's schedules."""
    alongside_torch: bool = False
    """Also run torch's schedule on the same split, alternating iteration by iteration."""
    iterations: int
    """Training iterations, warm-up included."""
    warmup: int
    """Leading iterations marked warm-up and left out of the summary."""
    seed: int
    """Weights and data seed."""
    lr: float
    """AdamW learning rate."""
    timeout_s: float
    """The process group's timeout: a stuck transfer fails after this many seconds."""
    trace_dir: str | None = None
    """The run's folder: per-rank parts, trace.json and summary.json (None: no files)."""
    inject_fault: str | None = None
    """RANK:KIND:STAGE:MB[:ITER]: raise inside that op (tests failure handling)."""
    fault_mode: Literal["raise", "kill"] | None = None
    """How the injected fault ends its rank: an error (default) or a silent SIGKILL."""
    dump_grads: str | None = None
    """Tests only: write each rank's first-iteration gradients to files with this prefix."""

    def document(self) -> dict[str, Any]:
        """The spec as the JSON object its file holds."""
        return {"format": FORMAT, **asdict(self)}

    def to_json(self) -> str:
        """The file's text: a field a line, each config section a line (read by people
        in a printed launch)."""
        return _layout(self.document(), 2)

    @classmethod
    def from_json(cls, text: str, source: str = "run spec") -> RunSpec:
        """Read a spec; a UserError names the first bad field."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise UserError(source, f"not a JSON run spec: {exc}",
                            "let ppsim run (or --print-launch) write it") from None
        if not isinstance(data, dict):
            raise UserError(source, "expected a JSON object", "let ppsim run write it")
        if data.get("format") != FORMAT:
            raise UserError("format", f"{data.get('format')!r} is not {FORMAT!r}",
                            "write the spec with this ppsim's ppsim run")
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in fields(cls)}
        for key in data:
            if key != "format" and key not in known:
                close = difflib.get_close_matches(key, list(known), n=1)
                raise UserError(key, "unknown field in the run spec",
                                f"did you mean {close[0]!r}?" if close else
                                "valid fields: " + ", ".join(known))
        values = {}
        for name, f in known.items():
            if name not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise UserError(name, "missing from the run spec",
                                    "let ppsim run write the spec")
                continue
            values[name] = _checked(name, data[name], hints[name])
        spec = cls(**values)
        for name in ("config", "versus"):
            if getattr(spec, name) is not None:
                _config(name, getattr(spec, name))
        return spec

    @classmethod
    def read(cls, path: str) -> RunSpec:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_BYTES + 1)
        except OSError as exc:
            raise UserError("--spec", f"cannot read {path}: {exc.strerror}",
                            "give the run-spec.json ppsim run wrote") from None
        if len(text) > MAX_BYTES:
            raise UserError("--spec", f"{path} is over {MAX_BYTES >> 20} MB",
                            "give the run-spec.json ppsim run wrote")
        return cls.from_json(text, path)

    def write(self, path: str) -> None:
        """Write the spec atomically: a rank never reads half of one."""
        write_json_atomic(path, self.document(), field="--trace-dir")

    def run_config(self) -> Config:
        return config_from_dict(self.config)

    def problems(self) -> list[Problem]:
        """The run's problem, then --versus's when there is one."""
        return [build_problem(config_from_dict(c)) for c in (self.config, self.versus)
                if c is not None]


def _layout(obj: Any, depth: int, pad: str = "") -> str:
    """JSON with the dicts of the first `depth` levels a key a line, compact below."""
    if not (isinstance(obj, dict) and obj and depth > 0):
        return json.dumps(obj, allow_nan=False)
    inner = pad + " "
    return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {_layout(v, depth - 1, inner)}"
                               for k, v in obj.items()) + f"\n{pad}}}"


def _config(name: str, data: dict[str, Any]) -> None:
    try:
        config_from_dict(data)
    except UserError as exc:
        raise UserError(f"{name}.{exc.field}", exc.problem, exc.fix) from None


def _checked(name: str, value: Any, hint: Any) -> Any:
    """`value` if it has the field's type (int for a float is fine); else a UserError."""
    options = typing.get_args(hint) if _union(hint) else (hint,)
    if value is None and type(None) in options:
        return None
    for kind in options:
        if typing.get_origin(kind) is Literal:
            if value in typing.get_args(kind) and isinstance(value, str):
                return value
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    math.isfinite(value):
                return float(value)
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif kind is not type(None) and isinstance(value, typing.get_origin(kind) or kind):
            return value
    raise UserError(name, f"expected {_show(hint)}, got {value!r}"[:200],
                    "let ppsim run write the spec")


def _union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _show(hint: Any) -> str:
    if _union(hint):
        return " or ".join(_show(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(v) for v in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(typing.get_origin(hint) or hint, "__name__", str(hint))

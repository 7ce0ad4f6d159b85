"""The app's file actions: export (and copy), save, load a trace, quit with unsaved edits.

A mixin of `ppsim.tui.app.PPSimApp`, kept apart so the app module stays about wiring.
Errors are said in words (which path, what is wrong, what to do), never as
raw errno text, and nothing is written into a folder that does not exist.
"""

from __future__ import annotations

import errno
import os
from datetime import datetime
from typing import Any

from textual.widgets import Static

from ppsim.cautions import flags_group
from ppsim.config.to_toml import config_to_toml
from ppsim.errors import UserError
from ppsim.fileio import find_overlap, write_text_atomic
from ppsim.pipeline.megatron_rules import split_refusals
from ppsim.pipeline.problem import hybrid_pattern
from ppsim.policy.costs import Fixed
from ppsim.policy.megatron import PolicyExport
from ppsim.policy.report import policy_flags
from ppsim.trace.read import read_trace
from ppsim.tui.exports import export_text
from ppsim.tui.screens import ConfirmQuit, PathPrompt
from ppsim.tui.session import config_for


def write_problem(path: str) -> str:
    """Why `path` cannot be written, in words, or '' when it can be tried."""
    if not path.strip():
        return "no path given"
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path} is a folder; give a file name"
    if os.path.islink(path):
        return f"{path} is a symbolic link; ppsim does not replace links: choose another path"
    if not os.path.isdir(folder):
        return f"the folder {folder} does not exist; create it first or choose another path"
    if not os.access(folder, os.W_OK):
        return f"the folder {folder} is not writable; choose another path"
    return ""


def os_error_text(path: str, exc: OSError) -> str:
    """An OSError from writing `path`, as a sentence."""
    reasons = {errno.ENOSPC: "the disk is full", errno.EACCES: "permission denied",
               errno.EROFS: "the file system is read-only", errno.ENAMETOOLONG:
               "the name is too long", errno.ENOENT: "the folder does not exist",
               errno.EISDIR: "it is a folder"}
    why = reasons.get(exc.errno or 0, (exc.strerror or "error").lower())
    return f"{path}: {why}"


def check_trace_info(trace: Any) -> None:
    """A trace whose otherData is not an object cannot say its shape: refuse it."""
    if not isinstance(getattr(trace, "info", {}), dict):
        raise UserError("trace", f"{trace.path}: otherData must be a JSON object",
                        "re-record the trace with ppsim run or ppsim simulate --trace")


class FileActions:
    """Export, copy, save, load-trace and quit actions (mixed into the App)."""

    saved_state: Any
    config_path: str | None
    trace_unsaid: str | None = None
    """A loaded trace whose comparison the status line has not said yet."""

    def _title(self) -> str:
        s = self.state  # type: ignore[attr-defined]
        return f"{s.model_preset or 'model'} {s.schedule} microbatches={s.microbatches}"

    def _inputs(self, what: str) -> dict[str, str | None]:
        """The files this app read, which `what` must not replace (a save may replace the
        config it was opened from: that is what saving means)."""
        trace = getattr(self, "trace", None)
        base = self.base  # type: ignore[attr-defined]
        return {**self.input_files,  # type: ignore[attr-defined]
                "the config": None if what == "save" else self.config_path,
                "the loaded trace": trace.path if trace is not None else None,
                "costs_file": base.costs_file, "actions_csv": base.pipeline.actions_csv}

    def _write(self, what: str, path: str, text: str) -> bool:
        problem = write_problem(path)
        if not problem:
            if (clash := find_overlap(self._inputs(what), {what: path})) is not None:
                problem = f"{path} is {clash.other}; ppsim never writes over what it read"
        if not problem:
            try:
                write_text_atomic(path, text)
            except OSError as exc:
                problem = os_error_text(path, exc)
            except UserError as exc:  # a special file, a full disk: said, never a crash
                problem = str(exc)
        if problem:
            self.notify(f"cannot {what}: {problem}", severity="error")  # type: ignore
            return False
        return True

    def _policy(self) -> PolicyExport | None:
        """The Megatron flags of the shown state's per-stage memory policy (None when
        the state follows the recompute mode, or is not simulated yet)."""
        result = self.result  # type: ignore[attr-defined]
        if result is None or result.state != self.state or not self.state.policies:  # type: ignore[attr-defined]
            return None
        problem = result.sim.problem
        return policy_flags(problem, problem.memory.policies) \
            if isinstance(problem.memory, Fixed) else None

    def _export_text(self, title: str = "") -> str:
        """The shown state's export: its split, its memory policy's flags and, for a
        hybrid stack, its pattern."""
        cfg = config_for(self.base, self.state)  # type: ignore[attr-defined]
        split, p = self.state.split, cfg.pipeline  # type: ignore[attr-defined]
        group = flags_group(cfg, split)  # as `ppsim split` passes it
        notes = split_refusals(split, p.microbatches, group,
                               p.microbatch_group_size is not None)
        return export_text(split, title, self._policy(), hybrid_pattern(cfg), group,
                           tuple(notes))

    def action_export(self) -> None:
        preview = self._export_text()
        self.push_screen(PathPrompt("Export the split to (y in the main screen copies it "  # type: ignore[attr-defined]
                                    "to the clipboard instead)", "ppsim-split.sh", preview),
                         self.export_to)

    def export_to(self, path: str | None) -> None:
        if not path:
            return
        text = self._export_text(self._title())
        if self._write("export", path, text):
            self.copy_to_clipboard(text)  # type: ignore[attr-defined]
            self.notify(f"split exported to {path} (and copied to the clipboard)")  # type: ignore

    def action_copy_export(self) -> None:
        text = self._export_text(self._title())
        self.copy_to_clipboard(text)  # type: ignore[attr-defined]
        self.notify("export (Megatron, torchtitan, DeepSpeed forms) copied to the clipboard")  # type: ignore

    def action_save(self) -> None:
        self._ask_save("Save the config (TOML) to", self.save_to)

    def _ask_save(self, title: str, then: Any) -> None:
        """Ask where to save (the config's own path first), then call `then(path)`."""
        self.push_screen(PathPrompt(title, self.config_path or "ppsim.toml"), then)  # type: ignore[attr-defined]

    def save_to(self, path: str | None) -> bool:
        """Save the config to `path`: True when it was written."""
        if not path:
            return False
        text = config_to_toml(config_for(self.base, self.state))  # type: ignore[attr-defined]
        if not self._write("save", path, text):
            return False
        self.config_path = path
        self.saved_state = self.state  # type: ignore[attr-defined]
        self.notify(f"config saved to {path}")  # type: ignore[attr-defined]
        return True

    def _save_and_quit(self, path: str | None) -> None:
        """The quit prompt's `s`: save, then quit; a refused save stays (its reason on
        the status line)."""
        if self.save_to(path):
            self.exit()  # type: ignore[attr-defined]

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """The palette's Screenshot: the screen as SVG into the Downloads folder (the
        current one where there is none: a server), as Textual saves it, but said on the
        status line in words (Textual's message is markup, which the status line shows
        as typed) and refused like any write."""
        stamp = datetime.now().strftime(time_format or "%Y-%m-%dT%H_%M_%S_%f")
        folder = path or os.path.join(os.path.expanduser("~"), "Downloads")
        target = os.path.join(folder if os.path.isdir(folder) else ".",
                              filename or f"ppsim_{stamp}.svg")
        if not self._write("save the screenshot", target, self.export_screenshot()):  # type: ignore[attr-defined]
            return None
        self.notify(f"screenshot saved: {target}")  # type: ignore[attr-defined]
        return target

    def action_load_trace(self) -> None:
        self.push_screen(PathPrompt(  # type: ignore[attr-defined]
            "Load a trace (Chrome JSON from ppsim run / simulate)"), self.load_trace)

    def load_trace(self, path: str | None) -> None:
        if not path:
            return
        box = self.query_one("#compare", Static)  # type: ignore[attr-defined]
        try:
            trace = read_trace(path)
            check_trace_info(trace)
        except UserError as exc:
            # the old trace goes too: its lanes must not stay drawn beside this error
            self.trace = self.trace_unsaid = None
            self.comparison = None
            self.notify(str(exc), severity="error")  # type: ignore[attr-defined]
            box.update(f"cannot load trace: {exc}")
            box.add_class("-shown")
            self._show_timeline()  # type: ignore[attr-defined]
            return
        self.trace = trace
        self.trace_unsaid = path
        self._show_timeline()  # type: ignore[attr-defined]

    def say_trace(self) -> None:
        """Once a just loaded trace is compared (at once, or after the simulation it
        waited for), say on the status line how it compares."""
        path, shown = self.trace_unsaid, self.comparison  # type: ignore[attr-defined]
        if path is None or shown is None:
            return
        self.trace_unsaid = None
        if shown.hidden:
            # The path last: an 80-column status line cuts its end.
            self.say(f"{shown.shape_note}; its figures are hidden: {path}",  # type: ignore
                     "warning")
        else:
            self.say(f"trace loaded: error {shown.rel_error:+.1%} (as ppsim diff), {path}")  # type: ignore

    async def action_quit(self) -> None:
        if self.saved_state is not None and self.saved_state == self.state:  # type: ignore
            self.exit()  # type: ignore[attr-defined]
            return
        self.push_screen(ConfirmQuit(), self._quit_answer)  # type: ignore[attr-defined]

    def _quit_answer(self, answer: str | None) -> None:
        if answer == "quit":
            self.exit()  # type: ignore[attr-defined]
        elif answer == "save":
            self._ask_save("Save the config (TOML) to, then quit", self._save_and_quit)

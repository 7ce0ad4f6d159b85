"""Messages the components post; the app turns them into edits (ppsim.tui.editing)."""

from __future__ import annotations

from textual.message import Message


class BoundaryMove(Message):
    """Move the boundary after stage `boundary` by `delta` layers."""

    def __init__(self, boundary: int, delta: int) -> None:
        super().__init__()
        self.boundary = boundary
        self.delta = delta


class StageClick(Message):
    """A mouse click on layer `layer` in stage `stage`'s row."""

    def __init__(self, stage: int, layer: int) -> None:
        super().__init__()
        self.stage = stage
        self.layer = layer


class CountSet(Message):
    """The count typed for a stage (unparsed: the app validates it)."""

    def __init__(self, stage: int, text: str) -> None:
        super().__init__()
        self.stage = stage
        self.text = text


class SettingChanged(Message):
    """A settings field was submitted or selected (unparsed)."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__()
        self.name = name
        self.text = text


class CursorMoved(Message):
    """The timeline cursor sits on op `op` of lane `lane` (-1: no op)."""

    def __init__(self, lane: int, op: int) -> None:
        super().__init__()
        self.lane = lane
        self.op = op


class PolicyKey(Message):
    """Step knob `knob` (ppsim.tui.policy_edit.KNOBS) of stage `stage`'s memory policy."""

    def __init__(self, stage: int, knob: str, step: int) -> None:
        super().__init__()
        self.stage = stage
        self.knob = knob
        self.step = step

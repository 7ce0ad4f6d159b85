"""A builder whose LM head hangs (`--model tests/model_sleepy.py:build`): the default GPT,
but the head's 7th forward (iteration 1 of a 4-microbatch run) sleeps for two minutes,
as a hung kernel or a stuck data loader would. Only the last rank builds the head, so it
is the rank that stalls; the others time out waiting for its messages."""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from ppsim.executor.builders.gpt import build as gpt

STALL_AT = 7
"""The head's forward call that sleeps (1-based)."""


class _SleepyHead(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: Any) -> Any:
        self.calls += 1
        if self.calls == STALL_AT:
            time.sleep(120)
        return self.inner(x)


class _Sleepy:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def head(self) -> nn.Module:
        return _SleepyHead(self._inner.head())


def build(fields: dict[str, Any]) -> Any:
    return _Sleepy(gpt(fields))

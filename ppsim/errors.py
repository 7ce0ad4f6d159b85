"""The one exception type for user mistakes.

The CLI turns a `UserError` into a single line on stderr and exit status 2;
anything else is a bug and keeps its traceback.
"""

import difflib
from collections.abc import Iterable


class UserError(ValueError):
    """Bad input from the user: a config field, a flag, a split, a trace."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}"
        if fix:
            msg += f" ({fix})"
        # One line, no terminal escapes: user-supplied names may hold control characters.
        # (A search refuses thousands of shapes: most messages are printable already.)
        super().__init__(msg if msg.isprintable() else
                         "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg))


def one_of(value: str, choices: Iterable[str]) -> str:
    """The fix for a name that is none of `choices`: the close ones first, then all."""
    names = list(choices)
    key = str(value).lower()
    close = ([n for n in names if n.lower() == key]
             or [n for n in names if n.lower().startswith(key)][:3]
             or difflib.get_close_matches(key, names, n=3, cutoff=0.6))
    listed = "choose one of " + ", ".join(names)
    return f"did you mean {' or '.join(close)}? {listed}" if close else listed

"""The one exception type for user mistakes.

The CLI turns a `UserError` into a single line on stderr and exit status 2;
anything else is a bug and keeps its traceback.
"""


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

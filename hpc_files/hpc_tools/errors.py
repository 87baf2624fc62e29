"""One kind of refusal for every tool here: a one-line message and an exit code."""

from __future__ import annotations

import sys


class ToolError(Exception):
    """A refusal: the message is one line; exit 2 (bad input) or 1 (a runtime failure)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def quoted(text: object) -> str:
    """Quote a user value for a one-line message."""
    s = str(text)
    if s.isprintable():
        return "'" + s + "'"
    return repr(s)


def report(prog: str, exc: ToolError) -> int:
    """``PROG: error: MESSAGE`` on stderr, the message on one line; returns the exit code."""
    message = " ".join(str(exc).splitlines())
    sys.stderr.write(f"{prog}: error: {message}\n")
    return exc.code

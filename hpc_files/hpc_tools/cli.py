"""The small option parser of status.sh and results.sh, and the project folder they read."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from hpc_tools.errors import ToolError


class Parser:
    """A small option parser: ``--opt value``, ``--opt=value``, errors as one line."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self) -> tuple[str, str | None]:
        if self.i >= len(self.argv):
            raise StopIteration
        word = self.argv[self.i]
        self.i += 1
        if word == "--":
            rest = self.argv[self.i :]
            self.i = len(self.argv)
            if len(rest) > 1:
                raise ToolError(f"unexpected argument {rest[1]!r}")
            return ("", rest[0]) if rest else ("--", None)
        if word.startswith("--") and "=" in word:
            name, _, value = word.partition("=")
            return name, value
        if word.startswith("-") and word != "-":
            return word, None
        return "", word

    def value(self, name: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if self.i >= len(self.argv):
            raise ToolError(f"{name} expects a value")
        self.i += 1
        return self.argv[self.i - 1]

    def target(self, name: str, inline: str | None, target: str | None) -> str | None:
        """The one positional word (EXP or JOBID), given as NAME/INLINE by the loop;
        a second one, or an option the caller did not take, is an error."""
        if name == "" and target is None and inline is not None:
            return inline
        if name not in ("", "--"):
            raise ToolError(f"unknown option {name!r} (see --help)")
        if inline is not None:
            raise ToolError(f"unexpected argument {inline!r}")
        return target

    def optional_value(self, inline: str | None) -> str | None:
        if inline is not None:
            return inline
        if self.i < len(self.argv) and re.fullmatch(r"\d+(\.\d+)?", self.argv[self.i]):
            self.i += 1
            return self.argv[self.i - 1]
        return None


def project_folder(project: str | None) -> tuple[str, str]:
    scratch = os.environ.get("SCRATCH", "")
    if not scratch:
        raise ToolError("SCRATCH is not set (the folder job_submitter.sh writes under)")
    if not project:
        raise ToolError("--project expects a name")
    return project, os.path.join(scratch, project)

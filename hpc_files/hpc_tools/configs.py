"""A configs file: one experiment (a command line) per line, as trials.

Blank lines and lines whose first non-blank character is ``#`` are skipped; an unquoted
``#`` that starts a word begins a comment, as in bash; a trailing ``\\`` joins the next
line (the backslash and newline are removed, as in bash). Each line is a command, split
with shell-word rules (``shlex``, posix) for the manifest's argv, never run: ``$VAR`` and
``$(...)`` stay literal text and the node expands them when it runs the line. Refused:
unbalanced quotes, a ``\\`` on the last line, and unquoted ``; & | < > ( )`` outside
``$(...)`` (on the node they would end or redirect the command; quote them). A label
(``--configs-label``) names the file in messages instead of ``FILE:LINE``.
"""

from __future__ import annotations

import shlex

from hpc_tools.errors import ToolError, quoted
from hpc_tools.files import read_source

UNQUOTED_OPERATORS = ";&|<>()"


def place(path: str, line: int | str, label: str | None) -> str:
    """Where a configs line is, for a message: FILE:LINE, or the label (--configs-label)
    that names the whole source."""
    return label or f"{path}:{line}"


def read_configs(path: str, label: str | None = None) -> list[dict]:
    """One trial per experiment line of a configs file (see the module docstring)."""
    content = read_source(path, "--configs", label)
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in content.split("\n")]
    trials = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        first = i + 1
        text, i = _scan_experiment(lines, i, path, label)
        if not text:
            continue
        try:
            argv = shlex.split(text, posix=True)
        except ValueError as exc:
            raise ToolError(f"{place(path, first, label)}: {exc}") from None
        if not argv:
            continue
        trials.append({"argv": argv, "params": {}, "source": f"configs:{first}", "command": text})
    if not trials:
        raise ToolError(f"{label or path}: no experiments (every line is blank or a comment)")
    return trials


def _scan_experiment(lines: list[str], i: int, path: str, label: str | None) -> tuple[str, int]:
    """Read one experiment starting at lines[i]; return its text and the next index.

    Tracks quotes the way bash does so that comments, continuations and unbalanced
    quotes are found; the text keeps every quote and backslash as written.
    """
    out: list[str] = []
    quote = ""
    quote_at = (0, 0)
    depth = 0  # nesting of $( ... )
    line = lines[i]
    pos = 0
    while True:
        if pos >= len(line):
            if quote:
                raise ToolError(
                    f"{place(path, quote_at[0], label)}: unbalanced {quote} quote "
                    f"(opened at column {quote_at[1]})"
                )
            break
        c = line[pos]
        if quote == "'":
            out.append(c)
            quote = "" if c == "'" else quote
            pos += 1
            continue
        if c == "\\":
            if pos == len(line) - 1:
                if quote:
                    raise ToolError(
                        f"{place(path, quote_at[0], label)}: unbalanced {quote} quote "
                        f"(opened at column {quote_at[1]})"
                    )
                if i + 1 >= len(lines):
                    raise ToolError(
                        f"{place(path, i + 1, label)}: '\\' continues a line but the file ends"
                    )
                i += 1
                line = lines[i]
                pos = 0
                continue
            out.append(line[pos : pos + 2])
            pos += 2
            continue
        if quote == '"':
            out.append(c)
            quote = "" if c == '"' else quote
            pos += 1
            continue
        if c in "'\"":
            quote = c
            quote_at = (i + 1, pos + 1)
        elif c == "#" and (not out or out[-1] in " \t"):
            break  # a comment runs to the end of the physical line
        elif c == "$" and line[pos + 1 : pos + 2] == "(":
            depth += 1
            out.append("$(")
            pos += 2
            continue
        elif c == "(" and depth:
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif c in UNQUOTED_OPERATORS and not depth:
            raise ToolError(
                f"{place(path, i + 1, label)}: unquoted {quoted(c)} at column {pos + 1} would end "
                "or redirect the command on the node; quote it"
            )
        out.append(c)
        pos += 1
    if depth:
        raise ToolError(f"{place(path, i + 1, label)}: unbalanced '$(': missing ')'")
    return "".join(out).strip(), i + 1

"""The user's input files read as text, and the tools' own files written atomically."""

from __future__ import annotations

import os

from hpc_tools.errors import ToolError, quoted


def read_source(path: str, what: str, label: str | None = None) -> str:
    """A configs or sweep file (option ``what``) as text: UTF-8 without NUL bytes; ``label``
    names it in messages instead of ``path``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ToolError(f"{what}: cannot read {quoted(path)}: {exc.strerror}") from None
    try:
        # utf-8-sig: a byte-order mark (Windows editors) is not part of the first line.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{label or path}: not UTF-8 text (byte {exc.start})") from None
    if "\0" in text:
        raise ToolError(f"{label or path}: contains a NUL byte")
    return text


def write_atomic(path: str, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it and a rename: a reader sees
    the old file or the new one, never half (the submitter and bayes.py's files)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ToolError(f"cannot write {quoted(path)}: {exc.strerror}", 1) from None

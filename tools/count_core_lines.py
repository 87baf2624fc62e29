"""Lines of code in the training core: non-blank, non-comment, non-docstring.

    .venv/bin/python tools/count_core_lines.py          # per file and the total
    .venv/bin/python tools/count_core_lines.py --max 900  # exit 1 above the budget

The core is what every training job runs (issue 12): setup, strategy, checkpoint, sampler,
stop agreement, precision, metrics and the optional Trainer with its optimizer helpers (optim.py:
the Params its optimizer factory gets, weight-decay groups, warmup-cosine). Examples, login-node
tools (trials.py, results.py and its curves are in hpc_files/hpc_tools/) and the digits dataset
writer are not counted.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

CORE = [
    "dist.py",
    "strategy.py",
    "checkpoint.py",
    "data.py",
    "signals.py",
    "precision.py",
    "metrics.py",
    "pieces.py",
    "trainer.py",
    "optim.py",
]


def docstring_lines(source: str) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding at least one token that is not a comment, newline or docstring."""
    skip = docstring_lines(source)
    ignored = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in ignored or tok.type == tokenize.ENDMARKER:
            continue
        for n in range(tok.start[0], tok.end[0] + 1):
            if n not in skip:
                lines.add(n)
    return len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=None, help="exit 1 above this many lines")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent / "hpc_harness"
    total = 0
    for name in CORE:
        path = root / name
        if not path.exists():
            continue
        n = code_lines(path.read_text())
        total += n
        print(f"{n:5d}  hpc_harness/{name}")
    print(f"{total:5d}  core total")
    if args.max is not None and total > args.max:
        print(f"core is {total} lines of code, above --max {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

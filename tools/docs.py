"""Checks the docs against the code: the options reference, the links and the runnable blocks.

    python3 tools/docs.py options            # rewrite docs/options.md from job_submitter.sh --help
    python3 tools/docs.py check              # options.md current, option spellings, links
    python3 tools/docs.py run [--cluster]    # run the runnable blocks (tests/bats/*/docs.bats)

A fenced block whose info string is ``bash runnable`` runs with no cluster; ``bash runnable
cluster`` runs on the local cluster (the integration suite). Each block runs as one
``bash -euo pipefail`` script from the repository root, with the caller's environment.
Every line that names ``job_submitter.sh`` must spell its options (before ``--``) as
``--help`` does, so a renamed option fails here even in a block that does not run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBMITTER = ROOT / "hpc_files" / "job_submitter.sh"
OPTIONS_PAGE = ROOT / "docs" / "options.md"
FENCE = re.compile(r"^```(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
LONG_OPTION = re.compile(r"(?<![\w=-])--[a-z][a-z0-9_-]*")
SITE_LIB = ROOT / "hpc_files" / "lib" / "site.sh"
SITES_PAGE = ROOT / "docs" / "sites.md"


def pages() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def help_text(help_file: Path | None = None) -> str:
    if help_file is not None:
        return help_file.read_text()
    done = subprocess.run(
        ["bash", str(SUBMITTER), "--help"], capture_output=True, text=True, check=True
    )
    return done.stdout


def options_page(text: str) -> str:
    return (
        "# Options of job_submitter.sh\n\n"
        "Generated from `bash hpc_files/job_submitter.sh --help` by `tools/docs.py options`;\n"
        "`make test` fails when this page and `--help` differ.\n\n"
        f"```text\n{text.rstrip()}\n```\n"
    )


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """Every fenced block of a page: (first line number, info string, code)."""
    found: list[tuple[int, str, str]] = []
    info, start, body = None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if info is None and match:
            info, start, body = match.group(1).strip(), number, []
        elif info is not None and line.rstrip() == "```":
            found.append((start, info, "\n".join(body) + "\n"))
            info = None
        elif info is not None:
            body.append(line)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    for _, _, code in blocks(path):
        text = text.replace(code, "")
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.MULTILINE)}


def check_links() -> list[str]:
    problems: list[str] = []
    linked_from_readme: set[Path] = set()
    for page in pages():
        code_free = page.read_text()
        for _, _, code in blocks(page):
            code_free = code_free.replace(code, "")
        for match in LINK.finditer(code_free):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}: link '{target}'"
            if not resolved.exists():
                problems.append(f"{where}: no such file")
                continue
            if page.name == "README.md" and page.parent == ROOT:
                linked_from_readme.add(resolved)
            if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading '#{anchor}' there")
    for page in pages()[1:]:
        if page.resolve() not in linked_from_readme:
            problems.append(f"{page.relative_to(ROOT)}: not linked from README.md")
    return problems


def logical_lines(path: Path) -> list[tuple[int, str]]:
    """The page's lines, a line ending in a backslash joined with the next ones."""
    joined: list[tuple[int, str]] = []
    start, parts = 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        start = start or number
        parts.append(line[:-1] if line.endswith("\\") else line)
        if not line.endswith("\\"):
            joined.append((start, " ".join(parts)))
            start, parts = 0, []
    return joined


def check_site_keys() -> list[str]:
    """Every key of SITE_KEYS in the profile reader is a row of docs/sites.md's table."""
    keys = re.findall(r"^\s*\[([a-z_]+)\]=(?:scalar|list)", SITE_LIB.read_text(), re.MULTILINE)
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", SITES_PAGE.read_text(), re.MULTILINE))
    if not keys:
        return [f"no SITE_KEYS found in {SITE_LIB.relative_to(ROOT)}"]
    return [
        f"docs/sites.md: site-profile key '{key}' is not in the table"
        for key in keys
        if key not in rows
    ]


def check_spellings(help_options: set[str]) -> list[str]:
    problems: list[str] = []
    for page in pages():
        if page.parent.name == "reports":
            continue
        for number, line in logical_lines(page):
            if "job_submitter.sh" not in line:
                continue
            own = line.split(" -- ", 1)[0]
            for option in LONG_OPTION.findall(own.split("job_submitter.sh", 1)[1]):
                if option not in help_options:
                    problems.append(
                        f"{page.relative_to(ROOT)}:{number}: {option} is not an option "
                        "of job_submitter.sh --help"
                    )
    return problems


def check(help_file: Path | None) -> int:
    text = help_text(help_file)
    problems = check_spellings(set(LONG_OPTION.findall(text)))
    if help_file is None and OPTIONS_PAGE.read_text() != options_page(text):
        problems.append("docs/options.md differs from --help: run python3 tools/docs.py options")
    problems += check_site_keys()
    problems += check_links()
    for problem in problems:
        print(f"docs.py: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run(cluster: bool, timeout: int) -> int:
    wanted = "bash runnable cluster" if cluster else "bash runnable"
    failed = count = 0
    for page in pages():
        for start, info, code in blocks(page):
            if " ".join(info.split()) != wanted:
                continue
            count += 1
            where = f"{page.relative_to(ROOT)}:{start}"
            began = time.monotonic()
            try:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                status, output = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                status, output = 124, f"timed out after {timeout} s: {exc.stderr or ''}"
            seconds = time.monotonic() - began
            if status != 0:
                failed += 1
                tail = "\n".join(str(output).splitlines()[-15:])
                print(f"docs.py: error: {where}: block exited {status}:\n{code}---\n{tail}")
            else:
                print(f"ok {where} ({seconds:.1f} s)")
    print(f"{count} runnable block(s), {failed} failed")
    return 1 if failed or count == 0 else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("options", help="rewrite docs/options.md from --help")
    checker = sub.add_parser("check", help="options page, option spellings, links")
    checker.add_argument("--help-file", type=Path, help="check spellings against this text")
    runner = sub.add_parser("run", help="run the runnable blocks")
    runner.add_argument("--cluster", action="store_true", help="the blocks marked cluster")
    # Generous: make test runs the doc test under nice beside the cluster suites, where a block
    # that takes 8 s alone has taken over 120 s.
    runner.add_argument("--timeout", type=int, default=600, help="seconds per block")
    args = parser.parse_args()
    if args.command == "options":
        OPTIONS_PAGE.write_text(options_page(help_text()))
        return 0
    if args.command == "check":
        return check(args.help_file)
    return run(args.cluster, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

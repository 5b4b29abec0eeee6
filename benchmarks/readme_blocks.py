"""Keep the printed command blocks of the README and docs/ equal to what their commands print.

A printed block is a fenced block (a bare ```` ``` ````) whose first line is
``$ stallfree ...``; every line after it, up to the closing fence, is that command's
output. Each block whose command is simulator-only and fast runs through the installed
``stallfree`` (the one beside this Python, so the venv's); the rest are skipped and
named with the reason (``skip_reason``: the engine, torch, servers, files made on
another machine; ``--slow`` adds the simulator's slow ones, ``tune``).

    .venv/bin/python benchmarks/readme_blocks.py --check   # README.md and docs/*.md; exit 1 and a diff where a block drifted
    .venv/bin/python benchmarks/readme_blocks.py --write   # put each command's output in its block
    .venv/bin/python benchmarks/readme_blocks.py --check --slow   # + tune's blocks (~40 s each)
    .venv/bin/python benchmarks/readme_blocks.py --check --readme docs/simulate.md   # one file

Figures that differ from run to run (wall-clock times, ``VOLATILE``) are masked for the
comparison, and ``--write`` leaves a block that differs only there as it is, so the README
does not churn. A line ``... text ...`` in a block stands for output left out on purpose:
the block's other lines must then appear in the output, in order; ``--write`` cannot
refill such a block and says so (exit 1).
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = "```"
PROMPT = "$ stallfree "
COMMAND_TIMEOUT_S = 120

# Subcommands that only run the simulator (numpy + matplotlib) in about a second.
SIMULATOR_ONLY = {"explain", "simulate", "specs"}
# The others, and why a check does not run them.
SKIPPED = {
    "generate": "runs the PyTorch engine",
    "serve": "starts the engine behind an HTTP server",
    "bench": "needs a running server",
    "profile": "times the PyTorch engine on this machine (minutes)",
    "validate": "runs the PyTorch engine beside the simulator (minutes)",
    "save-model": "writes a checkpoint with torch",
    "ui": "starts an HTTP server",
    "sweep": "a grid of capacity searches (minutes)",
}
# Simulator-only but slow: run only with --slow.
SLOW = {"tune": "a capacity search of ~100 simulations (~40 s on 2 cores)"}
# Options that take a simulator-only subcommand off the simulator, or make it write files.
SKIPPED_OPTIONS = {
    "--engine": "--engine torch measures the PyTorch engine on the wall clock",
    "--profile": "reads a profile measured on some machine",
    "--measured": "reads a measured run",
    "--html": "writes a file",
    "--plot": "writes figures",
    "--requests-out": "writes a file",
    "--trace-out": "writes a file",
}
# Run-to-run figures: each match is masked as a whole before comparing.
VOLATILE = (
    re.compile(r"simulation wall \(s\).*"),  # simulate's table row
    re.compile(r"trials in [\d.hm]+ ?s"),  # tune's header: 41.1s, 1m37.0s
)
ELISION = re.compile(r"^\s*\.\.\..*\.\.\.\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One printed block: ``lines[first:end]`` of the README are its output lines."""

    line_no: int  # 1-based, of the ``$ stallfree`` line
    command: str
    first: int
    end: int
    output: tuple[str, ...]

    @property
    def is_elided(self) -> bool:
        return any(ELISION.match(line) for line in self.output)


def find_blocks(lines: Sequence[str]) -> list[Block]:
    """Every printed block, in order. A command may continue over lines ending in ``\\``."""
    blocks = []
    i = 0
    while i < len(lines) - 1:
        if lines[i].rstrip() != FENCE or not lines[i + 1].startswith(PROMPT):
            i += 1
            continue
        line_no, j = i + 2, i + 1
        parts = [lines[j][2:].rstrip()]
        while parts[-1].endswith("\\") and j + 1 < len(lines):
            parts[-1] = parts[-1][:-1].rstrip()
            j += 1
            parts.append(lines[j].strip())
        end = j + 1
        while end < len(lines) and lines[end].rstrip() != FENCE:
            end += 1
        if end == len(lines):
            raise ValueError(f"line {line_no}: the block is never closed")
        blocks.append(Block(line_no, " ".join(parts), j + 1, end, tuple(lines[j + 1 : end])))
        i = end + 1
    return blocks


def skip_reason(command: str, *, slow: bool = False) -> str | None:
    """Why a check does not run ``command``, or None when it is simulator-only (and fast, unless ``slow``)."""
    argv = shlex.split(command)
    sub = argv[1] if len(argv) > 1 else ""
    if sub in SKIPPED:
        return f"`{sub}`: {SKIPPED[sub]}"
    if sub in SLOW and not slow:
        return f"`{sub}`: {SLOW[sub]}; --slow runs it"
    if sub not in SIMULATOR_ONLY and sub not in SLOW:
        return f"`{sub}` is not known to be simulator-only (add it to SIMULATOR_ONLY or SKIPPED)"
    for arg in argv[2:]:
        option, _, value = arg.partition("=")
        if option == "--engine" and (value or _after(argv, arg)) == "roofline":
            continue
        if option in SKIPPED_OPTIONS:
            return SKIPPED_OPTIONS[option]
    return None


def _after(argv: list[str], arg: str) -> str:
    i = argv.index(arg)
    return argv[i + 1] if i + 1 < len(argv) else ""


def stallfree_path() -> str:
    """The ``stallfree`` installed beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "stallfree"
    found = str(beside) if beside.exists() else shutil.which("stallfree")
    if found is None:
        raise SystemExit("no `stallfree` beside this Python or on PATH: pip install -e . first")
    return found


def run_command(command: str, cwd: Path) -> list[str]:
    """The command's standard output, one line per item, trailing blanks dropped."""
    argv = [stallfree_path(), *shlex.split(command)[1:]]
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"`{command}` exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return _tidy(done.stdout.splitlines())


def _tidy(lines: Sequence[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def _masked(line: str) -> str:
    for pattern in VOLATILE:
        line = pattern.sub("<varies>", line)
    return line


def matches(block_lines: Sequence[str], output: Sequence[str]) -> bool:
    """Whether the output is the block, volatile figures masked and elisions matching any lines."""
    want = [_masked(line) for line in _tidy(block_lines)]
    got = [_masked(line) for line in output]
    segments: list[list[str]] = [[]]
    for line in want:
        if ELISION.match(line):
            segments.append([])
        else:
            segments[-1].append(line)
    if len(segments) == 1:
        return want == got
    first, *middle, last = segments
    if got[: len(first)] != first or (last and got[-len(last) :] != last):
        return False
    pos, stop = len(first), len(got) - len(last)
    for segment in middle:
        pos = _find(got, segment, pos, stop)
        if pos < 0:
            return False
        pos += len(segment)
    return pos <= stop


def _find(lines: Sequence[str], segment: Sequence[str], start: int, stop: int) -> int:
    for i in range(start, stop - len(segment) + 1):
        if list(lines[i : i + len(segment)]) == list(segment):
            return i
    return -1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff where a block drifted")
    mode.add_argument("--write", action="store_true", help="rewrite drifted blocks in place")
    parser.add_argument("--slow", action="store_true", help=f"also run the slow blocks ({', '.join(SLOW)})")
    parser.add_argument(
        "--readme", type=Path, help="one Markdown file (default: README.md and every docs/*.md)"
    )
    args = parser.parse_args(argv)
    paths = [args.readme] if args.readme else [README, *sorted(DOCS.glob("*.md"))]
    failed = False
    for path in paths:
        failed |= check_file(path, write=args.write, slow=args.slow)
    return 1 if failed else 0


def display_name(path: Path) -> str:
    """``path`` relative to the repository (``docs/simulate.md``), else its name."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def check_file(path: Path, *, write: bool, slow: bool) -> bool:
    """Check (or, with ``write``, refresh) one file's blocks; True where one failed or drifted."""
    name = display_name(path)
    lines = path.read_text().splitlines()
    blocks = find_blocks(lines)
    failed = False
    replacements: list[tuple[Block, list[str]]] = []
    for block in blocks:
        where = f"{name}:{block.line_no}  $ {block.command}"
        reason = skip_reason(block.command, slow=slow)
        if reason is not None:
            print(f"skipped  {where}\n         ({reason})")
            continue
        began = time.perf_counter()
        try:
            output = run_command(block.command, path.parent)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"FAILED   {where}\n         {exc}")
            failed = True
            continue
        took = f"({time.perf_counter() - began:.1f} s)"
        if matches(block.output, output):
            print(f"ok       {where}  {took}")
        elif write and not block.is_elided:
            replacements.append((block, output))
            print(f"written  {where}  {took}")
        else:
            failed = True
            note = "; it elides lines, so update it by hand" if write else ""
            print(f"DIFFERS  {where}  {took}{note}")
            diff = difflib.unified_diff(
                _tidy(block.output),
                output,
                f"{name} (line {block.first + 1})",
                "command output",
                lineterm="",
            )
            print("\n".join(f"         {d}" for d in diff))
    for block, output in reversed(replacements):  # from the bottom up, so earlier indices hold
        lines[block.first : block.end] = output
    if replacements:
        path.write_text("\n".join(lines) + "\n")
    if not blocks:
        print(f"no `$ stallfree` blocks in {name}")
    return failed


if __name__ == "__main__":
    sys.exit(main())

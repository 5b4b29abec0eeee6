"""The README's and docs' printed blocks are what their commands print (benchmarks/readme_blocks.py).

The check runs the fast simulator-only blocks through the installed ``stallfree`` (about 2 s);
the rest of this file checks the script itself on a small README of its own.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "readme_blocks.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_blocks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_blocks"] = module
    spec.loader.exec_module(module)
    return module


blocks = _script()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_readme_blocks_match_their_commands() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok       README.md" in done.stdout  # at least one block ran, not all skipped
    assert "ok       docs/simulate.md" in done.stdout  # and the docs' pages are checked too


@pytest.mark.parametrize(
    ("command", "runs"),
    [
        ("stallfree explain", True),
        ("stallfree explain --engine roofline --sweep 256", True),
        ("stallfree simulate --policy chunked --cost-model full", True),
        ("stallfree explain --engine torch", False),
        ("stallfree explain --engine=torch", False),
        ("stallfree simulate --profile medium.profile.json", False),
        ("stallfree explain --plot out/explain", False),
        ("stallfree generate --model random:small --prompt hi", False),
        ("stallfree serve --model random:medium", False),
        ("stallfree tune --model mistral-7b", False),
        ("stallfree something-new", False),
    ],
)
def test_only_fast_simulator_commands_run(command: str, runs: bool) -> None:
    assert (blocks.skip_reason(command) is None) is runs


def test_tune_runs_with_slow() -> None:
    assert blocks.skip_reason("stallfree tune --model mistral-7b", slow=True) is None
    assert blocks.skip_reason("stallfree serve --model random:medium", slow=True) is not None


def test_matching_masks_wall_times_and_honours_elisions() -> None:
    assert blocks.matches(["  simulation wall (s)   0.14   0.12"], ["  simulation wall (s)   0.33   0.09"])
    assert blocks.matches(["5 trials in 41.1s on 2"], ["5 trials in 1m37.0s on 2"])
    assert not blocks.matches(["  steps   45,293"], ["  steps   45,294"])
    assert not blocks.matches(["a", "b"], ["a", "b", "c"])  # output the block leaves out is drift
    elided = ["head", "  ... rows ...", "tail"]
    assert blocks.matches(elided, ["head", "r1", "r2", "tail"])
    assert blocks.matches(elided, ["head", "tail"])
    assert not blocks.matches(elided, ["head", "r1", "tail", "extra"])
    assert not blocks.matches(["head", "... x ...", "mid", "... y ...", "tail"], ["head", "tail"])


def test_find_blocks_reads_commands_and_outputs() -> None:
    text = (
        "intro\n```\n$ stallfree explain \\\n    --sweep 256\nout 1\nout 2\n```\n```bash\nstallfree x\n```\n"
    )
    (block,) = blocks.find_blocks(text.splitlines())
    assert block.command == "stallfree explain --sweep 256"
    assert block.output == ("out 1", "out 2")
    assert block.line_no == 3


def test_check_then_write_then_check(tmp_path: Path) -> None:
    fresh = subprocess.run(
        [str(blocks.stallfree_path()), "explain", "--sweep", "256"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    torch_block = "```\n$ stallfree explain --engine torch\nwhatever it measured\n```\n"
    elided = f"```\n$ stallfree explain --sweep 256\n{fresh[0]}\n  ... the rest ...\n```\n"
    readme = tmp_path / "README.md"
    readme.write_text(
        "# t\n\n```\n$ stallfree explain --sweep 256\nstale output\n```\n\nprose\n\n" + torch_block + elided
    )
    done = _run("--check", "--readme", str(readme))
    assert done.returncode == 1
    assert "DIFFERS" in done.stdout and "-stale output" in done.stdout and "+" + fresh[0] in done.stdout
    assert "skipped" in done.stdout and "--engine torch" in done.stdout
    assert _run("--write", "--readme", str(readme)).returncode == 0
    written = readme.read_text()
    assert "stale output" not in written and "\n".join(fresh) in written
    assert written.endswith("prose\n\n" + torch_block + elided)  # skipped and elided blocks untouched
    again = _run("--check", "--readme", str(readme))
    assert again.returncode == 0, again.stdout

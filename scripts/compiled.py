"""The optional compiled build: the simulator's hot modules compiled by mypyc, beside their source.

The same typed Python, compiled to C extensions that Python imports in place of the ``.py`` files
(``src/stallfree/core/scheduler.cpython-*.so`` beside ``scheduler.py``); the pure-Python package
stays the reference and works without it. ``make compiled`` builds it (mypyc from ``.[dev]`` and
a C compiler), ``make pure`` removes it, and ``make test`` refuses a build older than its sources.

    python scripts/compiled.py build [--src DIR]   # compile in place (DIR: a copy of src/)
    python scripts/compiled.py clean [--src DIR]
    python scripts/compiled.py check [--src DIR]   # exit 1 if a compiled module is stale
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stallfree import stale_modules

SRC = Path(__file__).resolve().parent.parent / "src"

# The modules a simulation spends its time in (the scheduler core, the driver, the cost models).
MODULES = [
    "stallfree/core/block_manager.py",
    "stallfree/core/config.py",
    "stallfree/core/context.py",
    "stallfree/core/plan.py",
    "stallfree/core/policy.py",
    "stallfree/core/request.py",
    "stallfree/core/router.py",
    "stallfree/core/scheduler.py",
    "stallfree/core/state.py",
    "stallfree/core/steady.py",
    "stallfree/core/step.py",
    "stallfree/core/time_budget.py",
    "stallfree/costs/aiconfigurator.py",
    "stallfree/costs/measured.py",
    "stallfree/costs/roofline.py",
    "stallfree/costs/vidur.py",
    "stallfree/sim/driver.py",
    "stallfree/sim/fleet.py",
    "stallfree/sim/itl.py",
    "stallfree/sim/speculative.py",
    "stallfree/sim/traffic.py",
]
# Left pure: core/serving.py (its frozen configs cross to tune's worker processes, and a compiled
# frozen dataclass does not unpickle) and sim/disagg.py (mypyc 1.x mis-compiles a closure there).


def extensions(src: Path) -> list[Path]:
    """The compiled modules under ``src`` (and mypyc's shared runtime beside the package)."""
    found = [p for m in MODULES for p in (src / m).parent.glob(Path(m).stem + ".*.so")]
    return found + sorted(src.glob("*__mypyc.*.so"))


def build(src: Path) -> None:
    mypyc = Path(sys.executable).parent / "mypyc"
    if not mypyc.exists():
        sys.exit("mypyc is not installed: pip install -e '.[dev]' (it comes with mypy)")
    clean(src)
    done = subprocess.run([str(mypyc), *MODULES], cwd=src, capture_output=True, text=True)
    if done.returncode:
        clean(src)
        said = (done.stdout + done.stderr).strip().splitlines()
        sys.exit(
            "\n".join(
                [*said[-15:], "mypyc could not compile the modules (above); the pure package is unchanged"]
            )
        )
    for scratch in ("build", ".mypy_cache"):
        shutil.rmtree(src / scratch, ignore_errors=True)
    print(f"compiled {len(MODULES)} modules in {src}")


def build_copy(dest: Path) -> Path:
    """A copy of this checkout's src/ under ``dest``, compiled (for a side-by-side run or a test
    that leaves the checkout pure); its path, to put first on PYTHONPATH."""
    src = dest / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    build(src)
    return src


def environ(src: Path) -> dict[str, str]:
    """This process's environment with ``src`` (a :func:`build_copy`) first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(src)}


def clean(src: Path) -> None:
    for path in extensions(src):
        path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["build", "clean", "check"])
    parser.add_argument(
        "--src", type=Path, default=SRC, help="the source tree (default: this checkout's src/)"
    )
    args = parser.parse_args()
    if args.action == "build":
        build(args.src)
    elif args.action == "clean":
        clean(args.src)
    elif old := stale_modules(args.src / "stallfree"):
        print(f"the compiled build is older than {', '.join(old)}: run `make compiled` or `make pure`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The compiled build in place: the simulator's hot modules compiled by mypyc, beside their source.

The same typed Python, compiled to C extensions that Python imports in place of the ``.py`` files
(``src/stallfree/core/scheduler.cpython-*.so`` beside ``scheduler.py``); the pure-Python package
stays the reference and works without it. The build is the wheel's (setup.py, the one hook, with
the modules pyproject.toml's ``[tool.stallfree.mypyc]`` names): pip builds it, and its extensions
are put beside their sources. ``make compiled`` builds it (a C compiler; mypy from pip's isolated
build where this Python lacks it), ``make demo`` brings it up to date, ``make pure`` removes it, and
``make test`` refuses a build older than its sources.

    python scripts/compiled.py build [--src DIR]    # compile in place (DIR: the src/ of a copy)
    python scripts/compiled.py update [--src DIR]   # build unless a current build is there
    python scripts/compiled.py clean [--src DIR]
    python scripts/compiled.py check [--src DIR]    # exit 1 if a compiled module is stale
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

# Imported where used: stallfree (its stale_modules) and packaging, so that `make clean` runs on a
# Python that holds neither.
if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
# What a build reads beside src/ (copy_project copies them): the hook and the package's metadata.
PROJECT_FILES = ["pyproject.toml", "setup.py", "README.md", "LICENSE"]


def _pyproject(root: Path = ROOT) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


# The modules compiled, as paths under src/ (setup.py compiles the same list).
MODULES: list[str] = _pyproject()["tool"]["stallfree"]["mypyc"]["modules"]


def extensions(src: Path) -> list[Path]:
    """The compiled modules under ``src`` (and mypyc's shared runtime beside the package)."""
    found = [p for m in MODULES for p in (src / m).parent.glob(Path(m).stem + ".*.so")]
    return found + sorted(src.glob("*__mypyc.*.so"))


def _isolation(root: Path) -> list[str]:
    """pip's ``--no-build-isolation`` where this Python holds every build requirement (make test's
    install: nothing to download), else none (pip installs them in a throwaway environment)."""
    from packaging.requirements import Requirement  # matplotlib brings it

    def held(requirement: str) -> bool:
        wanted = Requirement(requirement)
        if wanted.marker is not None and not wanted.marker.evaluate():
            return True
        try:
            return wanted.specifier.contains(importlib.metadata.version(wanted.name), prereleases=True)
        except importlib.metadata.PackageNotFoundError:
            return False

    requires = _pyproject(root)["build-system"]["requires"]
    return ["--no-build-isolation"] if all(held(r) for r in requires) else []


def _compile(src: Path) -> str | None:
    """Builds the wheel of the tree ``src`` is the src/ of and puts its extensions beside their
    sources; None when done, else why not (the pure package is left as it was)."""
    clean(src)
    root = src.parent
    with tempfile.TemporaryDirectory(prefix="stallfree-wheel-") as wheels:
        pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", wheels]
        done = subprocess.run([*pip, *_isolation(root), str(root)], capture_output=True, text=True)
        said = (done.stdout + done.stderr).splitlines()
        built = sorted(Path(wheels).glob("stallfree-*.whl"))
        if done.returncode or not built:
            return "\n".join([*said[-15:], "pip could not build the wheel (above)"])
        with zipfile.ZipFile(built[0]) as wheel:
            names = [n for n in wheel.namelist() if n.endswith(tuple(EXTENSION_SUFFIXES))]
            if not names:  # setup.py's note says why
                notes = [line.strip() for line in said if line.strip().startswith("stallfree: ")]
                return "\n".join(notes) or "the wheel holds no compiled module"
            for name in names:
                wheel.extract(name, src)
    return None


def build(src: Path) -> None:
    if why := _compile(src):
        sys.exit(f"{why}\nno compiled build; the pure package is unchanged")
    print(f"compiled {len(MODULES)} modules in {src}")


def update(src: Path) -> None:
    """Builds unless a build of every module, newer than its sources, is there; where it cannot,
    says why and leaves the pure package (``make demo`` runs on)."""
    from stallfree import stale_modules

    if len(extensions(src)) == len(MODULES) + 1 and not stale_modules(src / "stallfree"):
        print(f"the compiled build in {src} is current")
    elif why := _compile(src):
        print(f"{why}\nthe pure Python package runs")
    else:
        print(f"compiled {len(MODULES)} modules in {src}")


def copy_project(dest: Path) -> Path:
    """A copy under ``dest`` of this checkout's src/ (pure) and the files its build reads; its src/."""
    src = dest / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, dest / name)
    return src


def build_copy(dest: Path) -> Path:
    """A :func:`copy_project` under ``dest``, compiled (for a side-by-side run or a test that leaves
    the checkout pure); the copy's src/, to put first on PYTHONPATH."""
    src = copy_project(dest)
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
    parser.add_argument("action", choices=["build", "update", "clean", "check"])
    parser.add_argument(
        "--src", type=Path, default=SRC, help="the source tree (default: this checkout's src/)"
    )
    args = parser.parse_args()
    if args.action == "build":
        build(args.src)
    elif args.action == "update":
        update(args.src)
    elif args.action == "clean":
        clean(args.src)
    else:
        from stallfree import stale_modules

        if old := stale_modules(args.src / "stallfree"):
            print(f"the compiled build is older than {', '.join(old)}: run `make compiled` or `make pure`")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

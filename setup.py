"""The compiled build's hook: a wheel (``pip install .``, ``pip wheel .``) compiles the simulator's hot
modules with mypyc where a C compiler is present, as black's wheels are built.

Everything else about the package is in pyproject.toml, the modules too (``[tool.stallfree.mypyc]``,
which scripts/compiled.py reads as well: ``make compiled`` is this build, put in place). A wheel
holds the pure package and the extensions beside it; the pure package alone, with one line on
stderr saying why (``pip install -v .`` shows it), where ``STALLFREE_PURE`` is set (to anything but
``0``), the install is editable (its sources change under it), mypyc, a C compiler or Python's
headers are missing, or mypyc or the compiler fails. mypyc runs in build_ext, once a build, not in
each of the calls setuptools makes to this file.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import Distribution, Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent


def modules(root: Path = ROOT) -> list[str]:
    """The modules compiled, as paths under ``src/`` (pyproject.toml's ``[tool.stallfree.mypyc]``)."""
    with (root / "pyproject.toml").open("rb") as file:
        return list(tomllib.load(file)["tool"]["stallfree"]["mypyc"]["modules"])


_NOTED: set[str] = set()


def note(why: str) -> None:
    """The one line saying why the build is pure (once, however often setuptools asks)."""
    if why not in _NOTED:
        _NOTED.add(why)
        print(f"stallfree: a pure Python build: {why}", file=sys.stderr)


def why_pure() -> str | None:
    """Why this build cannot compile, found cheaply (the compile may still fail), or None."""
    if os.environ.get("STALLFREE_PURE", "") not in ("", "0"):
        return "STALLFREE_PURE is set"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc (it comes with mypy) is not installed"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC")  # None on Windows: MSVC, found later
    if compiler and shutil.which(shlex.split(compiler)[0]) is None:
        return f"no C compiler ({shlex.split(compiler)[0]} is not on PATH)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "Python's headers (Python.h) are missing"
    return None


def compiled_files(root: Path) -> list[Path]:
    """The compiled modules under ``root`` (a build's lib, or src/) and mypyc's runtime beside them."""
    found = {
        path
        for suffix in EXTENSION_SUFFIXES
        for pattern in (f"stallfree/**/*{suffix}", f"*__mypyc{suffix}")
        for path in root.glob(pattern)
    }
    return sorted(found)


WHY_PURE = why_pure()


@functools.cache
def compile_to_c() -> list[Extension]:
    """mypyc's C for :func:`modules` (under build/), as the extensions to compile, or none where
    mypyc fails. mypy reads no config file here: the linter's strictness is not the compile's, and
    the packages an optional extra brings are only Any to it."""
    from mypyc.build import mypycify

    try:
        return mypycify(
            ["--config-file=", "--ignore-missing-imports", *(f"src/{module}" for module in modules())],
            opt_level="3",
        )
    except SystemExit:  # mypy's errors are printed above
        note("mypyc found type errors (above)")
    except Exception as error:
        note(f"mypyc failed ({type(error).__name__}: {error})")
    return []


class CompiledDistribution(Distribution):
    """A distribution whose extensions are known only once build_ext has run mypyc: it has them
    (its wheel is platform-specific) unless :func:`why_pure` says the build cannot compile."""

    def has_ext_modules(self) -> bool:
        return WHY_PURE is None


class Build(build):
    """Removes the compiled modules an earlier build left in build/lib: this build compiles afresh
    (its module list may have changed) or not at all (the wheel must not carry them)."""

    def run(self) -> None:
        if WHY_PURE is not None:
            note(WHY_PURE)  # build_ext does not run
        for path in compiled_files(Path(self.build_lib)):
            path.unlink()
        super().run()


class MypycBuildExt(build_ext):
    """Compiles :func:`modules` with mypyc, or, where it cannot, builds nothing (the pure package)."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules = self.mypyc_extensions()
        super().finalize_options()

    def mypyc_extensions(self) -> list[Extension]:
        commands = set(self.distribution.commands)
        if commands <= {"egg_info", "dist_info", "sdist"}:
            return []  # the package's metadata or sources: nothing is built (egg_info asks all the same)
        if WHY_PURE is not None:
            note(WHY_PURE)
            return []
        if self.editable_mode or "editable_wheel" in commands:
            note("an editable install (`make compiled` compiles in place)")
            return []
        return compile_to_c()

    def run(self) -> None:
        try:
            super().run()
        except (CCompilerError, BaseError):
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            note("the C compiler failed (above)")


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import modules() alone
    setup(distclass=CompiledDistribution, cmdclass={"build": Build, "build_ext": MypycBuildExt})

"""stallfree: LLM serving without stalls — one pure scheduler, simulated or real."""

import warnings
from pathlib import Path

__version__ = "0.1.0"


def build() -> str:
    """``compiled`` where the scheduler core imports as mypyc's build (a wheel built where a C
    compiler is, or ``make compiled`` in place), else ``pure Python``."""
    compiled = any((Path(__file__).parent / "core").glob("scheduler.*.so"))
    return "compiled" if compiled else "pure Python"


def stale_modules(package: Path = Path(__file__).parent) -> list[str]:
    """The modules of ``package`` (this one by default) compiled in place (``make compiled``) whose
    source changed after: Python imports the old build in place of the source all the same. Only in
    a source tree (src/ beside pyproject.toml): an installed wheel's files all date from its install,
    written in no particular order."""
    if not (package.parent.parent / "pyproject.toml").exists():
        return []
    stale = []
    for compiled in sorted(package.glob("*/*.so")):
        source = compiled.with_name(compiled.name.split(".")[0] + ".py")
        if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
            stale.append(source.relative_to(package.parent).as_posix())
    return stale


if _stale := stale_modules():
    warnings.warn(
        f"stallfree: {_stale[0]} changed after it was compiled: the old build runs until `make compiled` "
        "(or `make pure`)",
        stacklevel=2,
    )

"""stallfree: LLM serving without stalls — one pure scheduler, simulated or real."""

import warnings
from pathlib import Path

__version__ = "0.1.0"


def build() -> str:
    """``compiled`` where the scheduler core imports as mypyc's build (``make compiled``), else
    ``pure Python``."""
    compiled = any((Path(__file__).parent / "core").glob("scheduler.*.so"))
    return "compiled" if compiled else "pure Python"


def _warn_if_the_compiled_build_is_stale() -> None:
    """Python imports a compiled module (``make compiled``) in place of its source even after the
    source is edited: say so rather than run the old code silently."""
    here = Path(__file__).parent
    for compiled in (*here.glob("core/*.so"), *here.glob("costs/*.so"), *here.glob("sim/*.so")):
        source = compiled.with_name(compiled.name.split(".")[0] + ".py")
        if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
            warnings.warn(
                f"stallfree: {source.relative_to(here)} changed after `make compiled`: the old build "
                "runs until `make compiled` (or `make pure`)",
                stacklevel=2,
            )
            return


_warn_if_the_compiled_build_is_stale()

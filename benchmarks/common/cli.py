"""Run the ``stallfree`` command line the way a user would, from a benchmark script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# The CLI through this Python, for where no ``stallfree`` executable is installed.
PYTHON_MAIN = ("-c", "import sys; from stallfree.cli import main; sys.exit(main())")


def stallfree_argv() -> list[str]:
    """The ``stallfree`` beside this Python (the venv's), else the one on PATH, else this Python."""
    beside = Path(sys.executable).with_name("stallfree")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("stallfree")
    return [found] if found else [sys.executable, *PYTHON_MAIN]


def stallfree(*args: str, capture: bool = False) -> str:
    """Run ``stallfree ARGS`` (echoed on stderr; CalledProcessError if it fails); its stdout if
    ``capture``, else it prints as it runs and this returns ""."""
    print("$ stallfree " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run([*stallfree_argv(), *args], check=True, text=True, capture_output=capture)
    return done.stdout if capture else ""

"""The ``stallfree`` command line: the only place argv becomes config objects.

Each subcommand lives in its own module under ``stallfree.cli`` exposing
``register(subparsers)``; the module imports nothing heavy at import time
(torch, the server) so ``stallfree explain`` stays light. Any
:class:`UsageError` or ``ValueError`` raised by a handler becomes one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from stallfree import __version__, build
from stallfree.cli.common import UsageError
from stallfree.tune.sigint import SigintGuard, sigterm_as_sigint, stop_exit_code  # stdlib only

# Subcommand modules, in the order ``stallfree --help`` lists them.
COMMAND_MODULES = (
    "explain",
    "specs",
    "simulate",
    "tune",
    "sweep",
    "generate",
    "serve",
    "bench",
    "profile",
    "validate",
    "ui",
)


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2 (no usage dump). No abbreviated flags:
    ``tune --qps 0`` would otherwise be taken as ``--qps-start`` and answered in its name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone (its module alone is imported: a short
    run does not wait for the imports of the other commands)."""
    parser = _Parser(
        prog="stallfree",
        description="LLM serving without stalls: explain, simulate, run and tune stall-free batching.",
    )
    parser.add_argument("--version", action="version", version=f"stallfree {__version__} ({build()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES if command is None else (command,):
        importlib.import_module(f"stallfree.cli.{name}").register(sub)
    parser.set_defaults(command_parsers=sub.choices)  # so an error can be said by the command's parser
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (2 bad input, 130 / 143 stopped by SIGINT / SIGTERM)."""
    with sigterm_as_sigint():  # a SIGTERM stops every command as a Ctrl-C does, from the start
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    try:
        # Building the parser imports every command's module (and parsing may import what an
        # option's type needs), where a Ctrl-C often lands: raised inside an import's lock callback
        # it would be printed and dropped ("Exception ignored"), so it is only recorded there and
        # raised once the arguments are parsed.
        with SigintGuard() as guard:
            words = list(sys.argv[1:] if argv is None else argv)
            parser = build_parser(words[0] if words and words[0] in COMMAND_MODULES else None)
            if not words:
                parser.print_help(sys.stderr)  # no command: show them all, not only "arguments are required"
                return 2
            args, unknown = parser.parse_known_args(argv)
            if unknown:  # said by the command's parser, so the error names the command
                args.command_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
            guard.check()
    except KeyboardInterrupt:
        print("stallfree: interrupted", file=sys.stderr)
        return stop_exit_code()
    try:
        code: int = args.handler(args)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"stallfree {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stallfree {args.command}: interrupted", file=sys.stderr)
        return _stopped(stop_exit_code())
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return stop_exit_code() if code == 130 else code  # a command that stopped early says 130


def _stopped(code: int) -> int:
    """``code``, or, where an engine is still loading on its own thread (a server's, stopped
    mid-load), the process ends here with it: torch's C++ state must not be torn down under a
    thread still inside it (that aborts with 'terminate called without an active exception')."""
    if any(t.name == "stallfree-engine" and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

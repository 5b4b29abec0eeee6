"""``stallfree ui``: serve the interactive page (explain, traffic, tune) on 127.0.0.1:8050."""

from __future__ import annotations

import argparse

from stallfree.cli.common import UsageError, non_negative_int


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ui",
        help="an interactive page: move the chunk size and watch the streams stall or flow",
        description=(
            "Serve a page that re-runs the real scheduler as you move its controls: the explain scenario "
            "(the same numbers as `stallfree explain --json`), continuous traffic through the simulator "
            "with several policies side by side, and a saved `stallfree tune --json` result. "
            "`stallfree explain --html FILE` writes the explain view as one self-contained file."
        ),
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only)"
    )
    p.add_argument(
        "--port", type=non_negative_int, default=8050, help="port (default %(default)s; 0: any free port)"
    )
    p.add_argument("--open", action="store_true", help="open the page in the default web browser")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallfree.ui.server import make_server

    try:
        server = make_server(args.host, args.port)
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    host, port = server.server_address[:2]
    url = f"http://{host!s}:{port}/"
    print(f"stallfree ui: serving on {url} (Ctrl+C stops)", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0

"""``stallfree ui``'s HTTP server: the standard library's threading server over :func:`api.handle`.

The standard library rather than FastAPI: the page needs three JSON GETs, one POST and four
static files, and ``stallfree ui`` should run on the light install (``pip install -e .``:
numpy + matplotlib) as ``explain`` and ``simulate`` do. One thread per request, so a long
simulation does not hold up the explain view; a client that goes away mid-answer is ignored.
"""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stallfree.ui.api import MAX_BODY_BYTES, handle, to_json_bytes

log = logging.getLogger("stallfree.ui")


class _Handler(BaseHTTPRequestHandler):
    server_version = "stallfree-ui"
    quiet = False

    def do_GET(self) -> None:
        self._answer("GET", b"")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._send(413, "application/json", to_json_bytes({"error": {"message": "bad body length"}}))
            return
        self._answer("POST", self.rfile.read(length))

    def _answer(self, method: str, body: bytes) -> None:
        url = urlsplit(self.path)
        try:
            status, content_type, data = handle(method, url.path, parse_qs(url.query), body)
        except Exception:  # a bug, not bad input: say so, keep serving
            log.exception("stallfree ui: %s %s failed", method, self.path)
            status, content_type = 500, "application/json"
            data = to_json_bytes(
                {"error": {"message": "internal error (see the server's log)", "type": "server_error"}}
            )
        self._send(status, content_type, data)

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page cancelled the request

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(host: str = "127.0.0.1", port: int = 8050, *, quiet: bool = False) -> ThreadingHTTPServer:
    """A bound server (``port=0``: any free port); call ``serve_forever`` on it."""
    handler = type("Handler", (_Handler,), {"quiet": quiet})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a quiet server on a background thread (tests); returns it and its base URL."""
    server = make_server(host, port, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True, name="stallfree-ui").start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host!s}:{bound_port}"

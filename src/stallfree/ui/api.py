"""The page's JSON API as one pure function: (method, path, query, body) -> (status, headers, bytes).

Routes: ``GET /`` (the page), ``GET /static/NAME`` (its files), ``GET /api/presets``,
``GET /api/explain``, ``GET /api/simulate``, ``POST /api/tune``. Bad input of any kind
(:class:`~stallfree.ui.errors.ApiError`, or a ``ValueError`` from the library) is a 4xx with
an OpenAI-style error body; the server never answers 5xx for what a client sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import resources
from typing import Any

from stallfree.ui.errors import ApiError

STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
MAX_BODY_BYTES = 32 << 20

Response = tuple[int, str, bytes]


def static_text(name: str) -> str:
    """A file of the page (``index.html``, ``app.js``, ...), from the installed package."""
    return resources.files("stallfree.ui").joinpath("static", name).read_text(encoding="utf-8")


def presets() -> dict[str, Any]:
    """``GET /api/presets``: what the controls offer, and their defaults."""
    from stallfree.core import POLICIES
    from stallfree.costs import COST_MODEL_KINDS
    from stallfree.explain import DEFAULT_SWEEP
    from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS
    from stallfree.ui import explain_view, traffic_view
    from stallfree.workload import TRACE_NAMES

    return {
        "models": list(MODEL_PRESETS),
        "hardware": list(HARDWARE_PRESETS),
        "traces": list(TRACE_NAMES),
        "policies": list(POLICIES),
        "sweep": list(DEFAULT_SWEEP),
        "cost_models": list(COST_MODEL_KINDS),
        "explain_defaults": explain_view.defaults(),
        "traffic_defaults": traffic_view.DEFAULTS,
        "max_requests": traffic_view.MAX_REQUESTS,
    }


def to_json_bytes(value: Any) -> bytes:
    """Strict JSON (infinities and NaN become null: a browser's JSON.parse rejects them)."""
    return json.dumps(_finite(value), separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(status: int, value: Any) -> Response:
    return status, "application/json", to_json_bytes(value)


def handle(method: str, path: str, query: dict[str, list[str]], body: bytes = b"") -> Response:
    """Answer one request."""
    try:
        return _route(method, path, query, body)
    except ApiError as error:
        return _json(error.status, error.body())
    except (ValueError, FileNotFoundError) as error:
        # The library's own checks (a scenario, a workload, a policy): the client's input.
        return _json(400, ApiError(str(error)).body())


def _route(method: str, path: str, query: dict[str, list[str]], body: bytes) -> Response:
    from stallfree.ui.explain_view import explain_view
    from stallfree.ui.traffic_view import traffic_view
    from stallfree.ui.tune_view import tune_view

    gets: dict[str, Callable[[dict[str, list[str]]], dict[str, Any]]] = {
        "/api/presets": lambda q: presets(),
        "/api/explain": explain_view,
        "/api/simulate": traffic_view,
    }
    if path in gets or path == "/api/tune":
        wanted = "POST" if path == "/api/tune" else "GET"
        if method != wanted:
            raise ApiError(f"{path} takes {wanted}, not {method}", status=405)
        if wanted == "GET":
            return _json(200, gets[path](query))
        return _json(200, tune_view(_parse_body(body)))
    if method != "GET":
        raise ApiError(f"no such endpoint: {method} {path}", status=404)
    if path in ("/", "/index.html"):
        return 200, "text/html; charset=utf-8", static_text("index.html").encode()
    name = path.removeprefix("/static/")
    if path.startswith("/static/") and name in STATIC_FILES:
        return 200, STATIC_FILES[name], static_text(name).encode()
    raise ApiError(f"no such page: {path}", status=404)


def _parse_body(body: bytes) -> object:
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(f"the body is over {MAX_BODY_BYTES >> 20} MiB", status=413)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(f"the body is not JSON: {error}") from None

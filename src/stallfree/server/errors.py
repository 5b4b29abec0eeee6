"""What a client is told when its request is wrong: OpenAI error bodies, validation errors in words.

Every error a client can cause is ``{"error": {"message", "type", "param", "code"}}``; ``code``
is the HTTP status unless OpenAI names the error (``model_not_found``). pydantic's validation
errors are translated into messages a client can act on: a body that is not JSON (or not a JSON
object) says so, missing parameters are named in the message and in ``param``. Everything here
is pure: no engine, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}  # anything else under 500 is an invalid_request_error, as OpenAI's 404s are


class ServerError(Exception):
    """An error answered as an OpenAI error body with ``status_code`` (``code``: OpenAI's name of it)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status_code}}


def error_response(
    status_code: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(status_code, message, param, code), status_code=status_code, headers=headers
    )


def model_not_found(asked: str, served: str) -> ServerError:
    """OpenAI's answer to a model it does not have: 404, ``model_not_found``."""
    return ServerError(
        404,
        f"The model `{asked}` does not exist; this server serves `{served}`.",
        param="model",
        code="model_not_found",
    )


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def validation_message(
    errors: Sequence[Mapping[str, Any]], required: Sequence[str], content_type: str | None
) -> tuple[str, str | None]:
    """(message, param) of a request body pydantic rejected.

    ``required``: the parameters the route's body must have (named when the body is empty);
    ``content_type``: the request's header (a body that is not JSON was sent as something else).
    """
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    kind, where = first.get("type"), _param(first)
    if kind == "json_invalid":  # its loc is a character offset, not a parameter
        offset = next((part for part in first.get("loc", ()) if isinstance(part, int)), None)
        at = f" at character {offset}" if offset is not None else ""
        return f"the request body is not valid JSON ({first['msg']}{at})", None
    if not where and kind == "missing":
        return f"the request body is empty; it needs a JSON object with {_names(required)}", ",".join(
            required
        )
    if not where and kind in ("model_attributes_type", "model_type", "dict_type"):
        got = first.get("input")
        if isinstance(got, bytes):  # FastAPI parses JSON only when the content type says JSON
            sent = f"content-type {content_type}" if content_type else "no content-type"
            return (
                f"the request body is not JSON ({sent}); send a JSON object with "
                "'Content-Type: application/json'",
                None,
            )
        return f"the request body must be a JSON object, not {_JSON_TYPES.get(type(got), 'a number')}", None
    missing = [_param(error) for error in errors if error.get("type") == "missing"]
    if missing:
        noun = "parameter" if len(missing) == 1 else "parameters"
        return f"missing required {noun} {_names(missing)}", ",".join(missing)
    return f"{where or 'the request body'}: {first['msg']}", where or None


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def _param(error: Mapping[str, Any]) -> str:
    """The dotted parameter an error is about (``messages.0.role``); '' for the body itself."""
    loc = list(error.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    return ".".join(str(part) for part in loc)

"""The one error the page's API raises: a client mistake, answered 4xx with an OpenAI-style body.

Every view turns bad input into :class:`ApiError` (or lets a ``ValueError`` from the library
through, which the server answers the same way); nothing a client sends gets a 5xx.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Bad input: ``status`` (4xx), a message a person can act on, and the parameter at fault."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def body(self) -> dict[str, Any]:
        """The body OpenAI's API sends for a bad request."""
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


def one_value(query: dict[str, list[str]], name: str) -> str | None:
    """The single value of query parameter ``name`` (None when absent)."""
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise ApiError(f"{name} is given {len(values)} times; give it once", param=name)
    return values[0]


def check_known(query: dict[str, list[str]], known: tuple[str, ...]) -> None:
    unknown = sorted(set(query) - set(known))
    if unknown:
        raise ApiError(
            f"unknown parameter {unknown[0]!r}; this endpoint takes: {', '.join(known)}", param=unknown[0]
        )


def number(
    query: dict[str, list[str]], name: str, default: float, *, minimum: float, maximum: float
) -> float:
    """Query parameter ``name`` as a number in [minimum, maximum]."""
    text = one_value(query, name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ApiError(f"{name}: expected a number, got {text!r}", param=name) from None
    if not minimum <= value <= maximum:
        raise ApiError(f"{name}: must be between {minimum:g} and {maximum:g}, got {text}", param=name)
    return value


def whole(query: dict[str, list[str]], name: str, default: int, *, minimum: int, maximum: int) -> int:
    """Query parameter ``name`` as a whole number in [minimum, maximum]."""
    text = one_value(query, name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(f"{name}: expected a whole number, got {text!r}", param=name) from None
    if not minimum <= value <= maximum:
        raise ApiError(f"{name}: must be between {minimum:,} and {maximum:,}, got {value:,}", param=name)
    return value


def choice(query: dict[str, list[str]], name: str, default: str, choices: tuple[str, ...]) -> str:
    text = one_value(query, name)
    if text is None or text == "":
        return default
    if text not in choices:
        raise ApiError(f"{name}: unknown {text!r}; choose from: {', '.join(choices)}", param=name)
    return text

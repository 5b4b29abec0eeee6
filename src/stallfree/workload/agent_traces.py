"""Agent-session traces: JSON lines whose turns wait for earlier turns to finish.

Two formats (:data:`AGENT_TRACE_FORMATS`), plain or gzipped, read into
:class:`~stallfree.workload.agents.AgentTurns`:

- ``mooncake``: Mooncake rows (``input_length``, ``output_length``, optional ``hash_ids``) that
  may carry a ``session_id``. A session's first row starts at its ``timestamp`` (ms); each later
  row of the session is sent ``delay`` ms (alias ``delay_ms``) after the previous row of that
  session *finished*; a later row with a ``timestamp`` and no ``delay`` waits the gap between the
  two timestamps. A row with no ``session_id`` is its own session.
- ``agentic_mooncake`` (NVIDIA Dynamo's agent replay rows): ``request_id`` names the row;
  ``wait_for`` lists request ids that must finish first, after which the row waits ``delay`` +
  ``tool_wait_ms`` ms; a row that waits for nothing starts at its ``timestamp`` (ms). Fields the
  simulator has no use for (``branches``, ``prefix_reset``, ``tool_events``, priorities) are read
  past.

Both accept Dynamo's aliases (``input_tokens``, ``output_tokens``, ``created_time``). Times are
shifted so that the first start is at 0 s. ``hash_ids`` name 512-token prompt blocks (Mooncake's
:data:`~stallfree.workload.traces.MOONCAKE_BLOCK_TOKENS`). A turn *extends* (repeats as its prompt's
start, for ``bench``) the turn of its session it waits for when its prompt is at least that
turn's prompt and answer. Every error is one line naming the file and line.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stallfree.core.request import PromptBlocks, Request
from stallfree.workload.agents import AgentTurn, AgentTurns
from stallfree.workload.traces import MOONCAKE_BLOCK_TOKENS, open_text, positive_int

AGENT_TRACE_FORMATS = ("mooncake", "agentic_mooncake")


@dataclass(frozen=True, slots=True)
class _Row:
    """One line, checked: ids and times as read (ms), before they become turns."""

    request_id: str
    session_id: str | None
    request: Request  # arrival 0 until known
    timestamp_ms: float | None
    wait_for: tuple[str, ...]
    delay_ms: float | None


def load_agent_trace(path: str | os.PathLike[str], trace_format: str) -> AgentTurns:
    """Read ``path`` in ``trace_format`` (see the module docstring); ValueError (one line) for a
    malformed row, a repeated or unknown request id, or a cycle of waits."""
    if trace_format not in AGENT_TRACE_FORMATS:
        raise ValueError(
            f"unknown trace format {trace_format!r}; choose from {', '.join(AGENT_TRACE_FORMATS)}"
        )
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"trace file not found: {file}")
    agentic = trace_format == "agentic_mooncake"
    rows: list[_Row] = []
    with open_text(file) as text:
        for line_num, line in enumerate(text, 1):
            if line.strip():
                rows.append(_row(line, f"{file}, line {line_num}", agentic, len(rows)))
    if not rows:
        raise ValueError(f"{file}: no rows")
    turns = _from_zero(_agentic_turns(rows, file) if agentic else _session_turns(rows, file))
    try:
        return AgentTurns(tuple(turns), f"{trace_format} trace {file.name}")
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from None


def _row(line: str, where: str, agentic: bool, index: int) -> _Row:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    prompt = positive_int(str(_field(row, where, "input_length", "input_tokens")), "input_length", where)
    output = positive_int(str(_field(row, where, "output_length", "output_tokens")), "output_length", where)
    ids = row.get("hash_ids")
    blocks = None
    if ids is not None:
        if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise ValueError(f"{where}: hash_ids must be a list of whole numbers")
        if ids:
            per_id = MOONCAKE_BLOCK_TOKENS
            blocks = PromptBlocks(tuple(ids), per_id, min(prompt, len(ids) * per_id))
    session = row.get("session_id")
    if session is not None and not isinstance(session, (str, int)):
        raise ValueError(f"{where}: session_id must be a string")
    session = None if session is None else str(session)
    if agentic:
        rid = row.get("request_id")
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"{where}: request_id must be a non-empty string")
        waits = row.get("wait_for", [])
        if not (isinstance(waits, list) and all(isinstance(w, str) for w in waits)):
            raise ValueError(f"{where}: wait_for must be a list of request ids")
        delay = _ms(row, where, "delay", "delay_ms")
        tool = _ms(row, where, "tool_wait_ms")
        delay_ms = None if delay is None and tool is None else (delay or 0.0) + (tool or 0.0)
    else:
        rid, waits, delay_ms = str(index), [], _ms(row, where, "delay", "delay_ms")
    request = Request(rid, prompt, output, prompt_blocks=blocks, session_id=session)
    return _Row(rid, session, request, _ms(row, where, "timestamp", "created_time"), tuple(waits), delay_ms)


def _field(row: dict[str, Any], where: str, *names: str) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise ValueError(f"{where}: missing {names[0]}")


def _ms(row: dict[str, Any], where: str, *names: str) -> float | None:
    """A time in ms (None: absent): a finite number >= 0."""
    value = next((row[n] for n in names if n in row and row[n] is not None), None)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"{where}: {names[0]} must be a time >= 0 ms, got {value!r}")
    return float(value)


def _session_turns(rows: list[_Row], file: Path) -> list[AgentTurn]:
    """``mooncake``: each session's rows in file order, each waiting for the one before."""
    last: dict[str, _Row] = {}
    turns = []
    for number, row in enumerate(rows, 1):
        before = last.get(row.session_id) if row.session_id is not None else None
        if before is None:
            if row.timestamp_ms is None:
                raise ValueError(f"{file}: row {number} starts a session but has no timestamp")
            turns.append(_root(row))
        else:
            if row.delay_ms is not None:
                delay_ms = row.delay_ms
            elif row.timestamp_ms is not None and before.timestamp_ms is not None:
                delay_ms = max(0.0, row.timestamp_ms - before.timestamp_ms)
            else:
                raise ValueError(
                    f"{file}: row {number} continues session {row.session_id} with no delay or timestamp"
                )
            turns.append(_waiting(row, (before.request_id,), delay_ms, before))
        if row.session_id is not None:
            last[row.session_id] = row
    return turns


def _agentic_turns(rows: list[_Row], file: Path) -> list[AgentTurn]:
    """``agentic_mooncake``: each row waits for its ``wait_for`` rows, then its delay."""
    by_id = {r.request_id: r for r in rows}
    turns = []
    for row in rows:
        if not row.wait_for:
            if row.timestamp_ms is None:
                raise ValueError(f"{file}: request {row.request_id!r} waits for nothing and has no timestamp")
            turns.append(_root(row))
            continue
        same = [by_id[w] for w in row.wait_for if w in by_id and by_id[w].session_id == row.session_id]
        turns.append(_waiting(row, row.wait_for, row.delay_ms or 0.0, same[-1] if same else None))
    return turns


def _root(row: _Row) -> AgentTurn:
    """A row that starts at its timestamp (s; :func:`_from_zero` shifts them)."""
    assert row.timestamp_ms is not None
    return AgentTurn(replace(row.request, arrival_time_s=row.timestamp_ms / 1000))


def _from_zero(turns: list[AgentTurn]) -> list[AgentTurn]:
    """The turns with their starts shifted so that the first is at 0 s."""
    origin_s = min((t.request.arrival_time_s for t in turns if not t.wait_for), default=0.0)
    if origin_s == 0:
        return turns
    return [
        t
        if t.wait_for
        else replace(t, request=replace(t.request, arrival_time_s=t.request.arrival_time_s - origin_s))
        for t in turns
    ]


def _waiting(row: _Row, waits: tuple[str, ...], delay_ms: float, before: _Row | None) -> AgentTurn:
    """A row sent ``delay_ms`` after ``waits`` finish; it extends ``before`` if its prompt holds
    ``before``'s prompt and answer."""
    grown = before is not None and row.request.num_prompt_tokens >= (
        before.request.num_prompt_tokens + before.request.max_tokens
    )
    extends = before.request_id if grown and before is not None else None
    return AgentTurn(row.request, waits, delay_ms / 1000, extends)

"""Request-length trace files: short names, reading, validation and a per-process cache.

Two CSV layouts are read (plain or gzipped): ``arrived_at,num_prefill_tokens,num_decode_tokens``
(Azure/Splitwise, with arrival times in seconds) and ``num_prefill_tokens,num_decode_tokens,...``
(lengths only; extra columns are ignored); and Mooncake's JSON lines (``.jsonl``, plain or
gzipped: ``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``, one id per
512-token prompt block, equal ids meaning the same prefix block), whose prompts the prefix cache
can share. Invariants of a loaded :class:`Trace`: at least one
row, every length a positive whole number, arrival times (when present) finite, >= 0 and
non-decreasing. Its arrays are read-only because loaded traces are shared through the cache.

The public traces in ``stallfree/data/`` have short names (:data:`TRACE_NAMES`); a path that
exists always wins over a name.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

_Array = TypeVar("_Array", bound="np.ndarray[Any, Any]")

DATA_DIR = Path(__file__).parent.parent / "data"

TRACE_FILES: dict[str, str] = {
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv.gz",
    "bwb": "bwb_stats_llama2_tokenizer_filtered_v2.csv.gz",
    "splitwise-conv": "splitwise_conv.csv.gz",
    "splitwise-code": "splitwise_code.csv.gz",
    "mooncake-conversation": "mooncake_conversation_3000.jsonl.gz",
    "mooncake-synthetic": "mooncake_synthetic_1000.jsonl.gz",
}
TRACE_NAMES: tuple[str, ...] = tuple(TRACE_FILES)

PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"
ARRIVAL_COLUMN = "arrived_at"
MOONCAKE_BLOCK_TOKENS = 512
"""Prompt tokens per hash id in Mooncake's traces."""


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """One trace file's columns; row ``i`` is request ``i`` of the trace."""

    path: Path
    num_prompt_tokens: npt.NDArray[np.int64]
    num_output_tokens: npt.NDArray[np.int64]
    arrival_time_s: npt.NDArray[np.float64] | None  # None: a lengths-only trace
    hash_ids: tuple[tuple[int, ...], ...] | None = None  # per row, one per hash_block_tokens prompt tokens
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __len__(self) -> int:
        return len(self.num_prompt_tokens)


def resolve_trace_path(path_or_name: str | os.PathLike[str]) -> Path:
    """An existing file, else one of :data:`TRACE_NAMES`; FileNotFoundError naming both options."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    name = str(path_or_name)
    if name in TRACE_FILES:
        return DATA_DIR / TRACE_FILES[name]
    raise FileNotFoundError(
        f"trace file not found: {name} (not a file, and not one of the shipped traces: {', '.join(TRACE_NAMES)})"
    )


def load_trace(path_or_name: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace; the result is cached per file (and its modification time)."""
    path = resolve_trace_path(path_or_name).resolve()
    return _load_cached(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _load_cached(path: Path, mtime_ns: int) -> Trace:
    del mtime_ns  # only part of the cache key: an edited file is read again
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return _load_jsonl(path)
    with open_text(path) as text:
        content = text.read()
    reader = csv.reader(io.StringIO(content, newline=""))
    header = [name.strip() for name in next(reader, [])]
    missing = [name for name in (PROMPT_COLUMN, OUTPUT_COLUMN) if name not in header]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(header) or 'no header'}"
        )
    prompt_at = header.index(PROMPT_COLUMN)
    output_at = header.index(OUTPUT_COLUMN)
    arrival_at = header.index(ARRIVAL_COLUMN) if ARRIVAL_COLUMN in header else None
    table = _numbers(content, len(header))
    if table is not None and (fast := _checked(table, prompt_at, output_at, arrival_at)) is not None:
        return Trace(path, *fast)
    # a row the fast path cannot take: read them one by one, to name the bad line
    prompts: list[int] = []
    outputs: list[int] = []
    arrivals: list[float] = []
    for row in reader:
        if not row:
            continue  # blank line, e.g. at the end of the file
        where = f"{path}, line {reader.line_num}"
        if len(row) != len(header):
            raise ValueError(f"{where}: expected {len(header)} fields, got {len(row)}")
        prompts.append(positive_int(row[prompt_at], PROMPT_COLUMN, where))
        outputs.append(positive_int(row[output_at], OUTPUT_COLUMN, where))
        if arrival_at is not None:
            arrival_s = _arrival(row[arrival_at], where)
            if arrivals and arrival_s < arrivals[-1]:
                raise ValueError(
                    f"{where}: {ARRIVAL_COLUMN} goes back in time ({arrival_s} < {arrivals[-1]})"
                )
            arrivals.append(arrival_s)
    if not prompts:
        raise ValueError(f"{path}: no rows")
    return Trace(
        path=path,
        num_prompt_tokens=_frozen(np.array(prompts, dtype=np.int64)),
        num_output_tokens=_frozen(np.array(outputs, dtype=np.int64)),
        arrival_time_s=_frozen(np.array(arrivals, dtype=np.float64)) if arrival_at is not None else None,
    )


def _numbers(content: str, num_columns: int) -> npt.NDArray[np.float64] | None:
    """The rows under the header as a table of numbers, parsed by numpy (2-3x faster than row by
    row); None unless every row is ``num_columns`` plain numbers (no quotes, no blank lines)."""
    body = content[content.find("\n") + 1 :] if "\n" in content else ""
    if not body.strip() or '"' in body or "\r" in body or "\n\n" in body.rstrip("\n"):
        return None
    try:
        table = np.loadtxt(io.StringIO(body), delimiter=",", dtype=np.float64, ndmin=2, comments=None)
    except ValueError:
        return None
    num_rows = body.rstrip("\n").count("\n") + 1
    return table if table.shape == (num_rows, num_columns) else None


def _checked(
    table: npt.NDArray[np.float64], prompt_at: int, output_at: int, arrival_at: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64] | None] | None:
    """The trace's columns from a numeric table, or None if a value is one the row-by-row reader
    refuses (it then says which line)."""
    lengths = table[:, [prompt_at, output_at]]
    if not (np.isfinite(lengths).all() and (lengths > 0).all() and (lengths == np.floor(lengths)).all()):
        return None
    arrivals = None
    if arrival_at is not None:
        arrivals = np.ascontiguousarray(table[:, arrival_at])
        if not (np.isfinite(arrivals).all() and (arrivals >= 0).all() and (np.diff(arrivals) >= 0).all()):
            return None
        arrivals = _frozen(arrivals)
    prompts, outputs = (_frozen(lengths[:, i].astype(np.int64)) for i in (0, 1))
    return prompts, outputs, arrivals


def _load_jsonl(path: Path) -> Trace:
    """Mooncake's layout: one JSON object a line with timestamp (ms), input_length,
    output_length and hash_ids."""
    prompts: list[int] = []
    outputs: list[int] = []
    arrivals: list[float] = []
    hash_ids: list[tuple[int, ...]] = []
    with open_text(path) as text:
        for line_num, line in enumerate(text, 1):
            if not line.strip():
                continue
            where = f"{path}, line {line_num}"
            try:
                row = json.loads(line)
                fields = (row["timestamp"], row["input_length"], row["output_length"], row["hash_ids"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{where}: expected a JSON object with timestamp, input_length, output_length, "
                    f"hash_ids ({exc})"
                ) from None
            timestamp_ms, prompt, output, ids = fields
            prompts.append(positive_int(str(prompt), "input_length", where))
            outputs.append(positive_int(str(output), "output_length", where))
            arrival_s = _arrival(str(timestamp_ms), where) / 1000
            if arrivals and arrival_s < arrivals[-1]:
                raise ValueError(f"{where}: timestamp goes back in time ({arrival_s} s < {arrivals[-1]} s)")
            arrivals.append(arrival_s)
            if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
                raise ValueError(f"{where}: hash_ids must be a list of whole numbers")
            hash_ids.append(tuple(ids))
    if not prompts:
        raise ValueError(f"{path}: no rows")
    return Trace(
        path=path,
        num_prompt_tokens=_frozen(np.array(prompts, dtype=np.int64)),
        num_output_tokens=_frozen(np.array(outputs, dtype=np.int64)),
        arrival_time_s=_frozen(np.array(arrivals, dtype=np.float64)),
        hash_ids=tuple(hash_ids),
    )


def open_text(path: Path) -> io.TextIOWrapper:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def positive_int(text: str, column: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {column} is not a number: {text!r}") from None
    if not (math.isfinite(value) and value.is_integer() and value > 0):
        raise ValueError(f"{where}: {column} must be a positive whole number, got {text!r}")
    return int(value)


def _arrival(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {ARRIVAL_COLUMN} is not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: {ARRIVAL_COLUMN} must be a finite time >= 0 s, got {text!r}")
    return value


def _frozen(array: _Array) -> _Array:
    array.setflags(write=False)
    return array

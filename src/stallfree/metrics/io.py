"""Text in and out of :mod:`stallfree.metrics.summary`: goodput SLO strings, per-request CSV files
and table cells.

SLOs use ``vllm bench serve --goodput`` syntax: ``METRIC:MILLISECONDS`` pairs for ``ttft``,
``tpot`` and ``e2el``. The CSV has one row per :class:`~stallfree.metrics.summary.RequestRecord`, its
columns the record's fields in order; an unknown time (None) is an empty cell. Writing then
reading gives back equal records (the csv module writes floats with ``repr``, which round-trips).
A summary's None (a latency with no sample) is ``-`` in a table (:func:`format_metric`).
"""

from __future__ import annotations

import csv
import math
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from stallfree.metrics.summary import GOODPUT_METRICS, RequestRecord

RECORD_COLUMNS: tuple[str, ...] = tuple(field.name for field in fields(RequestRecord))


def parse_goodput(slos: str | Iterable[str]) -> dict[str, float]:
    """``"ttft:200 tpot:50"`` (or a list of such strings) -> ``{"ttft": 200.0, "tpot": 50.0}`` in ms."""
    texts = [slos] if isinstance(slos, str) else list(slos)
    pairs = [pair for text in texts for pair in text.replace(",", " ").split()]
    if not pairs:
        raise ValueError("no goodput SLO given; expected METRIC:MILLISECONDS pairs such as ttft:200 tpot:50")
    parsed: dict[str, float] = {}
    for pair in pairs:
        name, sep, number = pair.partition(":")
        try:
            slo_ms = float(number) if sep else math.nan
        except ValueError:
            slo_ms = math.nan
        if math.isnan(slo_ms):
            raise ValueError(f"bad goodput SLO {pair!r}; expected METRIC:MILLISECONDS such as ttft:200")
        if name not in GOODPUT_METRICS:
            raise ValueError(
                f"unknown goodput metric {name!r} in {pair!r}; choose from {', '.join(GOODPUT_METRICS)}"
            )
        if not 0 <= slo_ms < math.inf:
            raise ValueError(f"goodput SLO for {name} must be a finite number of ms >= 0, got {number}")
        if name in parsed:
            raise ValueError(f"goodput SLO for {name} given twice")
        parsed[name] = slo_ms
    return parsed


def format_metric(value: float | int | None, fmt: str) -> str:
    """``fmt.format(value)``, or ``-`` for None: a metric with no sample, never a 0 that reads as fast."""
    return "-" if value is None else fmt.format(value)


def write_records_csv(records: Iterable[RequestRecord], path: str | os.PathLike[str]) -> int:
    """Write records to ``path`` (parent folders are created); returns how many were written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    row_of = operator.attrgetter(*RECORD_COLUMNS)
    count = 0
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(RECORD_COLUMNS)
        for record in records:
            writer.writerow(row_of(record))  # csv writes None as "" and floats with repr
            count += 1
    return count


def _optional_float(text: str) -> float | None:
    return float(text) if text else None


_CONVERTERS: dict[str, Callable[[str], object]] = {
    "request_id": str,
    "arrival_s": float,
    "first_scheduled_s": _optional_float,
    "first_token_s": _optional_float,
    "finish_s": float,
    "num_prompt_tokens": int,
    "num_output_tokens": int,
    "max_itl_s": float,
    "num_preemptions": int,
    "finish_reason": str,
    "num_cached_tokens": int,
}
_OPTIONAL_COLUMNS = {"num_cached_tokens": "0"}  # files written before prefix caching lack it


def read_records_csv(path: str | os.PathLike[str]) -> list[RequestRecord]:
    """Records written by :func:`write_records_csv`; ValueError names missing columns or bad lines."""
    source = Path(path)
    with source.open(newline="", encoding="utf-8") as text:
        reader = csv.DictReader(text)
        missing = [
            name
            for name in RECORD_COLUMNS
            if name not in (reader.fieldnames or []) and name not in _OPTIONAL_COLUMNS
        ]
        if missing:
            raise ValueError(f"{source}: missing column(s) {', '.join(missing)}")
        records = []
        for row in reader:
            try:
                values = {
                    name: _CONVERTERS[name](row.get(name) or _OPTIONAL_COLUMNS.get(name, ""))
                    for name in RECORD_COLUMNS
                }
                records.append(RequestRecord(**values))  # type: ignore[arg-type]
            except (TypeError, ValueError) as error:
                raise ValueError(f"{source}, line {reader.line_num}: {error}") from None
    return records


_CLASS_COLUMNS = (
    ("done", "completed", "{:,}"),
    ("TTFT p50", "median_ttft_ms", "{:,.1f}"),
    ("TTFT p99", "p99_ttft_ms", "{:,.1f}"),
    ("TPOT p50", "median_tpot_ms", "{:,.2f}"),
    ("ITL p50", "median_itl_ms", "{:,.2f}"),
    ("ITL p99", "p99_itl_ms", "{:,.2f}"),
    ("max ITL", "max_itl_ms", "{:,.1f}"),
    ("goodput/s", "request_goodput", "{:,.3f}"),
)


def class_lines(title: str, classes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A table of traffic classes' scores (:func:`stallfree.workload.classes.class_summaries`):
    each class's latencies (ms) and goodput by its own SLOs."""
    lines = [
        "",
        f"  {title} (ms; goodput: completed requests a second within the class's SLOs):",
        f"  {'':<12}{'priority':>9}" + "".join(f"{label:>11}" for label, _, _ in _CLASS_COLUMNS),
    ]
    for name, c in classes.items():
        cells = "".join(f"{format_metric(c.get(key), fmt):>11}" for _, key, fmt in _CLASS_COLUMNS)
        lines.append(f"  {name:<12}{c['priority']:>9}{cells}")
    return lines

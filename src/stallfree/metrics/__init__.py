"""Serving metrics: per-request token timestamps -> TTFT, TPOT, ITL, E2EL, goodput.

The SAME code scores simulated and measured runs (:mod:`.summary`); :mod:`.io` reads and writes
goodput SLO strings and per-request CSV files.
"""

from stallfree.metrics.io import (
    RECORD_COLUMNS,
    format_metric,
    parse_goodput,
    read_records_csv,
    write_records_csv,
)
from stallfree.metrics.summary import (
    COMPLETED_REASONS,
    GOODPUT_METRICS,
    PERCENTILES,
    ItlAccumulator,
    RequestRecord,
    Summary,
    record_from_token_times,
    summarize,
    weighted_stats,
)

__all__ = [
    "COMPLETED_REASONS",
    "GOODPUT_METRICS",
    "PERCENTILES",
    "RECORD_COLUMNS",
    "ItlAccumulator",
    "RequestRecord",
    "Summary",
    "format_metric",
    "parse_goodput",
    "read_records_csv",
    "record_from_token_times",
    "summarize",
    "weighted_stats",
    "write_records_csv",
]

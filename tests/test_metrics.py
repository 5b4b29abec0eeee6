"""Metrics: hand-checked TTFT/TPOT/ITL/E2EL, weighted == expanded statistics, goodput, CSV."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.metrics import (
    ItlAccumulator,
    RequestRecord,
    Summary,
    record_from_token_times,
    summarize,
    weighted_stats,
)
from stallfree.metrics.io import format_metric, parse_goodput, read_records_csv, write_records_csv

VLLM_KEYS = {
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
} | {
    f"{stat}_{m}_ms"
    for stat in ("mean", "median", "std", "p90", "p99")
    for m in ("ttft", "tpot", "itl", "e2el")
}


def small_run() -> tuple[list[RequestRecord], ItlAccumulator]:
    """A: arrives 0 s, tokens at 1.0, 1.5, 2.5 s. B: arrives 1 s, one token at 1.2 s. C: rejected."""
    itl = ItlAccumulator()
    records = [
        record_from_token_times(
            request_id="A",
            arrival_s=0.0,
            token_times_s=[1.0, 1.5, 2.5],
            num_prompt_tokens=10,
            itl=itl,
            first_scheduled_s=0.25,
        ),
        record_from_token_times(
            request_id="B", arrival_s=1.0, token_times_s=[1.2], num_prompt_tokens=20, itl=itl
        ),
        record_from_token_times(
            request_id="C",
            arrival_s=2.0,
            token_times_s=[],
            num_prompt_tokens=99_999,
            itl=itl,
            finish_reason="rejected",
        ),
    ]
    return records, itl


def test_hand_checked_small_run() -> None:
    records, itl = small_run()
    assert records[0].max_itl_s == 1.0 and records[1].max_itl_s == 0.0
    assert records[2].first_token_s is None and records[2].finish_s == 2.0
    s = summarize(records, itl, duration_s=4.0)
    assert set(s) >= VLLM_KEYS
    assert (s["completed"], s["rejected"], s["failed"]) == (2, 1, 0)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (30, 4)
    assert (
        s["request_throughput"] == 0.5
        and s["output_throughput"] == 1.0
        and s["total_token_throughput"] == 8.5
    )
    assert s["request_goodput"] is None
    expected = {
        # TTFT: A 1.0 s, B 0.2 s.
        "mean_ttft_ms": 600,
        "median_ttft_ms": 600,
        "std_ttft_ms": 400,
        "p90_ttft_ms": 920,
        "p99_ttft_ms": 992,
        # TPOT: only A has > 1 token: (2.5 - 1.0) / 2.
        "mean_tpot_ms": 750,
        "p99_tpot_ms": 750,
        "std_tpot_ms": 0,
        # ITL: A's gaps 0.5 s and 1.0 s.
        "mean_itl_ms": 750,
        "median_itl_ms": 750,
        "std_itl_ms": 250,
        "p90_itl_ms": 950,
        "p99_itl_ms": 995,
        "max_itl_ms": 1000,
        # E2EL: A 2.5 s, B 0.2 s.
        "mean_e2el_ms": 1350,
        "p90_e2el_ms": 2270,
        # Only A knows when it was first scheduled.
        "mean_scheduling_delay_ms": 250,
        "p99_scheduling_delay_ms": 250,
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value), key
    assert s["num_preemptions"] == 0


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ("ttft:500", 1),  # only B
        ("tpot:700", 1),  # A's TPOT is 750 ms; B has one token, so TPOT 0 passes (vLLM)
        ("ttft:1000 tpot:800", 2),  # A's TTFT is exactly 1000 ms: meeting an SLO includes equality
        ("ttft:1000 e2el:2000", 1),
        ("e2el:100", 0),
    ],
)
def test_goodput_counts_completed_requests_meeting_every_slo(slos: str, good: int) -> None:
    records, itl = small_run()
    assert summarize(records, itl, 4.0, parse_goodput(slos))["request_goodput"] == good / 4.0


def test_empty_run_has_no_latencies() -> None:
    """vLLM prints 0 here; a 0 reads as "fast", so nothing completed gives None (null)."""
    s = summarize([], ItlAccumulator(), duration_s=1.0)
    assert s["completed"] == 0 and s["output_throughput"] == 0.0
    assert s["mean_ttft_ms"] is None and s["p99_itl_ms"] is None and s["max_itl_ms"] is None
    assert s["mean_scheduling_delay_ms"] is None


def test_single_token_requests_have_no_tpot_or_itl() -> None:
    """Completed with one token each: TTFT and E2EL are measured, TPOT and ITL have no sample,
    so they are None (vLLM's 0 reads as fast), and a table shows "-"."""
    itl = ItlAccumulator()
    records = [
        record_from_token_times(
            request_id=str(i), arrival_s=0.1 * i, token_times_s=[0.1 * i + 0.05], num_prompt_tokens=8, itl=itl
        )
        for i in range(3)
    ]
    s = summarize(records, itl, duration_s=1.0)
    assert s["completed"] == 3 and s["mean_ttft_ms"] == pytest.approx(50.0) and s["p99_e2el_ms"] is not None
    for stat in ("mean", "median", "std", "p90", "p99"):
        assert s[f"{stat}_tpot_ms"] is None and s[f"{stat}_itl_ms"] is None
    assert s["max_itl_ms"] is None
    assert format_metric(s["mean_tpot_ms"], "{:.2f}") == "-"
    assert format_metric(s["mean_ttft_ms"], "{:.2f}") == "50.00"


def test_failed_requests_stay_out_of_latencies() -> None:
    itl = ItlAccumulator()
    aborted = record_from_token_times(
        request_id="x",
        arrival_s=0.0,
        token_times_s=[5.0, 9.0],
        num_prompt_tokens=4,
        itl=itl,
        finish_reason="abort",
    )
    assert itl.num_samples == 0 and aborted.max_itl_s == 4.0
    s = summarize([aborted], itl, 10.0)
    assert (s["completed"], s["failed"], s["mean_e2el_ms"]) == (0, 1, None)


def test_bad_duration_is_rejected() -> None:
    for duration_s in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="duration"):
            summarize([], ItlAccumulator(), duration_s)
    # Nothing completed (every request rejected on arrival) may take no time: rates are 0.
    empty = summarize([], ItlAccumulator(), 0.0)
    assert empty["request_throughput"] == 0.0 and empty["mean_ttft_ms"] is None


# --- weighted ITL samples ----------------------------------------------------------------------

weighted_entries = st.lists(
    st.tuples(st.floats(0.0, 5.0, allow_nan=False), st.integers(0, 40)), min_size=1, max_size=40
).filter(lambda entries: sum(count for _, count in entries) > 0)


@settings(max_examples=200, deadline=None)
@given(weighted_entries)
def test_weighted_stats_equal_numpy_on_the_expanded_array(entries: list[tuple[float, int]]) -> None:
    values = np.array([v for v, _ in entries])
    counts = np.array([c for _, c in entries])
    expanded = np.repeat(values, counts)
    stats = weighted_stats(values, counts)
    # Order statistics pick the same elements and interpolate the same way: equal, not just close.
    assert stats["median"] == np.median(expanded)
    assert stats["p90"] == np.percentile(expanded, 90)
    assert stats["p99"] == np.percentile(expanded, 99)
    assert stats["max"] == expanded.max()
    assert stats["mean"] == pytest.approx(np.mean(expanded), rel=1e-12, abs=1e-15)
    assert stats["std"] == pytest.approx(np.std(expanded), rel=1e-9, abs=1e-12)


def test_accumulator_add_and_add_many_agree() -> None:
    one, many = ItlAccumulator(), ItlAccumulator()
    for value, count in [(0.012, 30), (0.5, 0), (0.02, 1)]:
        one.add(value, count)
    many.add_many([0.012, 0.5, 0.02], [30, 0, 1])
    assert one.values_s.tolist() == many.values_s.tolist() and one.counts.tolist() == many.counts.tolist()
    assert (one.num_entries, one.num_samples) == (3, 31)
    many.add_many(np.full(5, 0.01))  # count 1 each
    assert many.num_samples == 36
    assert one.stats() == weighted_stats([0.012, 0.5, 0.02], [30, 0, 1])


@pytest.mark.parametrize(("value", "count"), [(-0.1, 1), (float("nan"), 1), (float("inf"), 1), (0.1, -1)])
def test_accumulator_rejects_bad_samples(value: float, count: int) -> None:
    with pytest.raises(ValueError):
        ItlAccumulator().add(value, count)
    with pytest.raises(ValueError):
        ItlAccumulator().add_many([value], [count])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.001, 0.2), min_size=2, max_size=30),
    st.lists(st.integers(1, 30), min_size=1, max_size=12),
    st.lists(st.integers(0, 5), min_size=12, max_size=12),
)
def test_token_times_path_equals_weighted_step_path(
    step_durations_s: list[float], num_tokens: list[int], first_steps: list[int]
) -> None:
    """A lock-step batch: every running stream gets one token per step. The simulator's way
    (one weighted entry per step) and the measured way (each request's token times) agree."""
    step_ends_s = list(itertools.accumulate(step_durations_s))
    streams = []
    for i, tokens in enumerate(num_tokens):
        first = min(first_steps[i], len(step_ends_s) - 1)
        streams.append((first, min(tokens, len(step_ends_s) - first)))
    # Measured: each request's token times.
    measured_itl = ItlAccumulator()
    measured = [
        record_from_token_times(
            request_id=str(i),
            arrival_s=0.0,
            token_times_s=step_ends_s[first : first + n],
            num_prompt_tokens=7,
            itl=measured_itl,
        )
        for i, (first, n) in enumerate(streams)
    ]
    # Simulated: per step, one entry (gap, number of streams that got a non-first token in it).
    simulated_itl = ItlAccumulator()
    for step in range(1, len(step_ends_s)):
        decoding = sum(first < step < first + n for first, n in streams)
        simulated_itl.add(step_ends_s[step] - step_ends_s[step - 1], decoding)
    simulated = [
        RequestRecord(
            request_id=str(i),
            arrival_s=0.0,
            first_token_s=step_ends_s[first],
            finish_s=step_ends_s[first + n - 1],
            num_prompt_tokens=7,
            num_output_tokens=n,
            max_itl_s=max(
                (step_ends_s[s] - step_ends_s[s - 1] for s in range(first + 1, first + n)), default=0.0
            ),
        )
        for i, (first, n) in enumerate(streams)
    ]
    assert simulated == measured
    assert_same_summary(summarize(measured, measured_itl, 10.0), summarize(simulated, simulated_itl, 10.0))


def assert_same_summary(a: Summary, b: Summary) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key.startswith(("mean_itl", "std_itl")) and a[key] is not None:
            assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-12), key  # summation order differs
        else:
            assert a[key] == b[key], key


# --- records ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"first_token_s": 0.5}, "ordered"),
        ({"finish_s": 1.5}, "ordered"),
        ({"first_scheduled_s": 2.5}, "ordered"),
        ({"num_output_tokens": -1}, ">= 0"),
        ({"first_token_s": None}, "no first_token_s"),
        ({"first_token_s": None, "num_output_tokens": 0}, "without a token"),
        ({"arrival_s": float("nan")}, "finite"),
    ],
)
def test_record_validation(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "request_id": "r",
        "arrival_s": 1.0,
        "first_token_s": 2.0,
        "finish_s": 3.0,
        "num_prompt_tokens": 5,
        "num_output_tokens": 2,
    }
    RequestRecord(**fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        RequestRecord(**(fields | changes))  # type: ignore[arg-type]


def test_csv_round_trip(tmp_path: Path) -> None:
    records, _ = small_run()
    records.append(
        RequestRecord(
            request_id="p,q",  # needs quoting
            arrival_s=0.1 + 0.2,
            first_token_s=1 / 3,
            finish_s=2.0,
            num_prompt_tokens=1,
            num_output_tokens=9,
            max_itl_s=0.7,
            num_preemptions=2,
            finish_reason="stop",
        )
    )
    path = tmp_path / "out" / "requests.csv"
    assert write_records_csv(records, path) == 4
    assert read_records_csv(path) == records


def test_csv_read_errors(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("request_id,arrival_s\nx,1\n")
    with pytest.raises(ValueError, match=r"missing column.*finish_s"):
        read_records_csv(path)
    records, _ = small_run()
    write_records_csv(records, path)
    path.write_text(path.read_text().replace(",10,", ",ten,"))
    with pytest.raises(ValueError, match="line 2"):
        read_records_csv(path)


# --- goodput SLO strings ------------------------------------------------------------------------


def test_parse_goodput_forms() -> None:
    assert parse_goodput("ttft:200 tpot:50") == {"ttft": 200.0, "tpot": 50.0}
    assert parse_goodput(["ttft:200", "e2el:1e4"]) == {"ttft": 200.0, "e2el": 10_000.0}
    assert parse_goodput("tpot:0,ttft:1.5") == {"tpot": 0.0, "ttft": 1.5}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no goodput SLO"),
        ("ttft=200", "METRIC:MILLISECONDS"),
        ("ttft:", "METRIC:MILLISECONDS"),
        ("ttft:fast", "METRIC:MILLISECONDS"),
        ("itl:20", "unknown goodput metric 'itl'"),
        ("ttft:-5", ">= 0"),
        ("ttft:inf", "finite"),
        ("ttft:1 ttft:2", "twice"),
    ],
)
def test_parse_goodput_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_goodput(text)

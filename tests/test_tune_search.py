"""Capacity search logic, SLO judging and budget candidates, with fake trial outcomes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.tune.candidates import TILE_TOKENS, budget_candidates, round_to_tile
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.slo import Slo, Slos


def run_search(config: SearchConfig, threshold_qps: float) -> tuple[CapacitySearch, list[float]]:
    """Drive a search against a monotone system that meets the SLOs up to ``threshold_qps``."""
    search = CapacitySearch(config)
    tried = []
    while (qps := search.next_qps()) is not None:
        tried.append(qps)
        search.record(qps, qps <= threshold_qps)
        assert len(tried) < 100
    return search, tried


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.floats(0.05, 500.0),
    start=st.floats(0.5, 50.0),
    precision=st.sampled_from([0.01, 0.05, 0.2]),
)
def test_binary_search_finds_threshold_within_precision(
    threshold: float, start: float, precision: float
) -> None:
    config = SearchConfig(qps_start=start, precision=precision, qps_min=1e-3, qps_max=1e5)
    search, tried = run_search(config, threshold)
    assert search.capacity_qps <= threshold
    assert threshold < search.capacity_qps * (1 + precision)
    assert search.capacity_qps in tried
    assert search.hi is not None and search.hi <= search.capacity_qps * (1 + precision)
    # Bracketing by doubling/halving then bisection: logarithmic in range / precision.
    bracket_steps = abs(math.log2(threshold / start)) + 1
    assert len(tried) <= bracket_steps + math.log2(math.log(2) / math.log1p(precision)) + 2


def test_nothing_passes_gives_zero_capacity() -> None:
    search, tried = run_search(SearchConfig(qps_start=4.0, qps_min=0.5, qps_max=100), threshold_qps=0.0)
    assert search.capacity_qps == 0.0
    assert tried == [4.0, 2.0, 1.0, 0.5]
    assert not search.hit_qps_max


def test_everything_passes_stops_at_qps_max() -> None:
    search, tried = run_search(SearchConfig(qps_start=1.0, qps_min=0.5, qps_max=10), threshold_qps=math.inf)
    assert tried == [1.0, 2.0, 4.0, 8.0]
    assert search.capacity_qps == 8.0
    assert search.hit_qps_max


def test_estimate_of_trials_left_reaches_zero() -> None:
    search = CapacitySearch(SearchConfig(qps_start=1.0, precision=0.05))
    estimates = []
    while (qps := search.next_qps()) is not None:
        estimates.append(search.trials_left_estimate())
        search.record(qps, qps <= 3.3)
    assert all(e >= 1 for e in estimates)
    assert search.trials_left_estimate() == 0
    assert search.num_trials == len(estimates)


def test_recording_a_qps_that_was_not_proposed_is_an_error() -> None:
    search = CapacitySearch(SearchConfig(qps_start=1.0))
    search.next_qps()
    with pytest.raises(ValueError, match="not the one proposed"):
        search.record(3.0, True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"qps_start": 0.0}, "qps_start"),
        ({"qps_start": 1.0, "precision": 1.5}, "precision"),
        ({"qps_start": 1.0, "qps_min": 2.0}, "qps_min <= qps_start"),
    ],
)
def test_bad_search_config(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SearchConfig(**kwargs)


def test_slos_judge_summary_metrics_in_their_units() -> None:
    slos = Slos.from_mapping({"tbt_p99_ms": 100, "sched_delay_p50_s": 2})
    good = {"p99_itl_ms": 99.0, "median_scheduling_delay_ms": 1999.0}
    assert slos.is_met(good)
    assert slos.violations({"p99_itl_ms": 101.0, "median_scheduling_delay_ms": 2500.0}) == (
        "tbt_p99_ms",
        "sched_delay_p50_s",
    )
    assert slos.worst_ratio({"p99_itl_ms": 50.0, "median_scheduling_delay_ms": 3000.0}) == pytest.approx(1.5)
    # Nothing completed: a missing metric never meets an SLO.
    assert slos.violations({"p99_itl_ms": 10.0, "median_scheduling_delay_ms": None}) == ("sched_delay_p50_s",)
    assert "P50 scheduling delay 3 s (SLO 2 s)" in Slo("sched_delay_p50_s", 2).describe(
        {"median_scheduling_delay_ms": 3000.0}
    )


def test_bad_slos() -> None:
    with pytest.raises(ValueError, match="unknown SLO"):
        Slo("tbt_p95_ms", 10)
    with pytest.raises(ValueError, match="positive"):
        Slo("tbt_p99_ms", 0)
    with pytest.raises(ValueError, match="at least one"):
        Slos(())


@given(ridge=st.floats(10.0, 3000.0), low_exp=st.integers(6, 9), span=st.integers(0, 6))
def test_budget_candidates_are_tile_multiples_around_ridge_and_powers_of_two(
    ridge: float, low_exp: int, span: int
) -> None:
    low, high = 2**low_exp, 2 ** (low_exp + span)
    budgets = budget_candidates(ridge, low, high)
    assert list(budgets) == sorted(set(budgets))
    assert all(b % TILE_TOKENS == 0 and low <= b <= high for b in budgets)
    assert {2**k for k in range(low_exp, low_exp + span + 1)} <= set(budgets)
    for multiple in (1, 2, 4):
        rounded = round_to_tile(ridge * multiple)
        assert abs(rounded - ridge * multiple) <= TILE_TOKENS / 2 or rounded == TILE_TOKENS
        assert (rounded in budgets) == (low <= rounded <= high)


def test_round_to_tile() -> None:
    assert [round_to_tile(t) for t in (1, 95, 96, 153, 257, 1000)] == [64, 64, 128, 128, 256, 1024]
    with pytest.raises(ValueError):
        round_to_tile(0)


def test_a_latency_with_no_sample_fails_only_when_nothing_completed() -> None:
    """TBT is None when no request had two tokens: nothing to miss beside completed requests;
    with nothing completed (or the key missing) the SLO fails."""
    slos = Slos.from_mapping({"tbt_p99_ms": 100.0})
    assert slos.is_met({"completed": 5, "p99_itl_ms": None})
    assert not slos.is_met({"completed": 0, "p99_itl_ms": None})
    assert not slos.is_met({"completed": 5})

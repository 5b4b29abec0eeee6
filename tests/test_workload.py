"""Workloads: trace files, arrival processes, length distributions, caps, CLI-style options."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stallfree.core import PromptBlocks
from stallfree.workload import (
    TRACE_NAMES,
    AllAtOnce,
    FixedLengths,
    LognormalLengths,
    ReplayArrivals,
    TraceLengths,
    UniformLengths,
    Workload,
    WorkloadOptions,
    cap_lengths,
    gamma,
    generate,
    iter_requests,
    load_trace,
    parse_lengths,
    poisson,
    sample,
    traces,
    workload_from_options,
)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- trace files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_shipped_traces_load_by_name(name: str) -> None:
    trace = load_trace(name)
    assert len(trace) >= 1000
    assert trace.num_prompt_tokens.min() >= 1 and trace.num_output_tokens.min() >= 1
    assert (trace.arrival_time_s is not None) == name.startswith(("splitwise", "mooncake"))
    assert (trace.hash_ids is not None) == name.startswith("mooncake")


def test_mooncake_rows_and_hash_ids(tmp_path: Path) -> None:
    """Timestamps in ms, one hash id per 512 prompt tokens; a workload built on it carries them to
    its requests, and bad rows are named."""
    rows = [
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
        '{"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}',
    ]
    path = write(tmp_path / "t.jsonl", "\n".join(rows) + "\n")
    trace = load_trace(path)
    assert trace.arrival_time_s is not None and trace.arrival_time_s.tolist() == [0.0, 1.5]
    assert trace.hash_ids == ((0, 1), (0, 1, 2)) and trace.hash_block_tokens == 512
    requests = generate(Workload(ReplayArrivals(str(path)), TraceLengths(str(path), "in-order")))
    assert [r.prompt_blocks for r in requests] == [
        PromptBlocks((0, 1), 512, 600),
        PromptBlocks((0, 1, 2), 512, 1100),
    ]
    write(path, rows[0] + '\n{"timestamp": 10, "input_length": 3}\n')
    with pytest.raises(ValueError, match="line 2: expected a JSON object with timestamp"):
        load_trace(path)


def test_a_trace_with_prefix_hashes_is_read_in_order_by_default() -> None:
    """Its sharing is between neighbouring rows; drawn at random, rows would repeat whole prompts."""
    assert parse_lengths("mooncake-conversation") == TraceLengths("mooncake-conversation", "in-order")
    assert parse_lengths("sharegpt") == TraceLengths("sharegpt", "with-replacement")
    assert parse_lengths("mooncake-conversation", "with-replacement").sampling == "with-replacement"


def test_sharegpt_matches_published_stats() -> None:
    # The shared README gives 30,731 rows, prompt median 1730, output max 1024.
    trace = load_trace("sharegpt")
    assert len(trace) == 30_731
    assert np.median(trace.num_prompt_tokens) == 1730
    assert trace.num_output_tokens.max() == 1024


def test_both_formats_plain_and_gzipped(tmp_path: Path) -> None:
    lengths = write(
        tmp_path / "l.csv",
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n10,5,15,2.0\n7,3,10,2.3\n",
    )
    with gzip.open(tmp_path / "a.csv.gz", "wt") as out:
        out.write("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,5\n1.5,7,3\n\n")
    plain, zipped = load_trace(lengths), load_trace(tmp_path / "a.csv.gz")
    assert plain.num_prompt_tokens.tolist() == zipped.num_prompt_tokens.tolist() == [10, 7]
    assert plain.num_output_tokens.tolist() == [5, 3]
    assert plain.arrival_time_s is None
    assert zipped.arrival_time_s is not None and zipped.arrival_time_s.tolist() == [0.5, 1.5]


def test_existing_path_wins_over_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "sharegpt", "num_prefill_tokens,num_decode_tokens\n3,4\n")
    assert len(load_trace("sharegpt")) == 1


@pytest.mark.parametrize("name", [n for n in TRACE_NAMES if not n.startswith("mooncake")])
def test_csv_traces_read_the_same_by_numpy_and_row_by_row(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = traces._load_cached(traces.resolve_trace_path(name).resolve(), 0)
    monkeypatch.setattr(traces, "_numbers", lambda content, num_columns: None)
    slow = traces._load_cached(traces.resolve_trace_path(name).resolve(), 1)
    for column in ("num_prompt_tokens", "num_output_tokens", "arrival_time_s"):
        a, b = getattr(fast, column), getattr(slow, column)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), column


def test_blank_lines_and_quotes_are_read_row_by_row(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", 'num_prefill_tokens,num_decode_tokens\n1,2\n\n"3",4\n')
    trace = load_trace(path)
    assert trace.num_prompt_tokens.tolist() == [1, 3] and trace.num_output_tokens.tolist() == [2, 4]


def test_missing_trace_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.csv.*sharegpt"):
        load_trace(tmp_path / "nope.csv")


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "arrived_at,prompt,num_decode_tokens\n0,1,2\n")
    with pytest.raises(ValueError, match=r"missing column.*num_prefill_tokens"):
        load_trace(path)


@pytest.mark.parametrize(
    ("row", "problem"),
    [("0,5", "positive"), ("-3,5", "positive"), ("4,x", "not a number"), ("2.5,5", "whole"), ("4", "fields")],
)
def test_bad_rows_report_line_number(tmp_path: Path, row: str, problem: str) -> None:
    path = write(tmp_path / "t.csv", f"num_prefill_tokens,num_decode_tokens\n1,1\n{row}\n")
    with pytest.raises(ValueError, match=f"line 3.*{problem}"):
        load_trace(path)


def test_arrivals_must_not_go_back_in_time(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,1,1\n1,1,1\n")
    with pytest.raises(ValueError, match=r"line 3.*back in time"):
        load_trace(path)


def test_empty_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rows"):
        load_trace(write(tmp_path / "t.csv", "num_prefill_tokens,num_decode_tokens\n"))


# --- arrival processes -------------------------------------------------------------------------


def test_poisson_rate_and_exponential_gaps() -> None:
    times = sample(Workload(poisson(4.0), FixedLengths(8, 8)), 20_000, seed=1).arrival_time_s
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    # Exponential: coefficient of variation 1.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_the_gap_variance(burstiness: float) -> None:
    gaps = np.diff(
        sample(Workload(gamma(2.0, burstiness), FixedLengths(8, 8)), 20_000, seed=2).arrival_time_s
    )
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    # Gamma(shape k, scale 1/(qps k)): variance = 1 / (qps^2 k).
    assert gaps.var() == pytest.approx(1.0 / (4.0 * burstiness), rel=0.1)


def test_gamma_with_burstiness_one_is_poisson() -> None:
    lengths = FixedLengths(8, 8)
    one = sample(Workload(gamma(3.0, 1.0), lengths), 100, seed=5).arrival_time_s
    assert np.array_equal(one, sample(Workload(poisson(3.0), lengths), 100, seed=5).arrival_time_s)


@pytest.mark.parametrize("qps", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_qps_is_rejected(qps: float) -> None:
    with pytest.raises(ValueError, match="qps"):
        poisson(qps)


def test_all_at_once() -> None:
    assert [r.arrival_time_s for r in generate(Workload(AllAtOnce(), FixedLengths(4, 2)), 3)] == [0.0] * 3


def test_replay_shifts_to_zero_and_scales(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n10,5,1\n11,6,2\n14,7,3\n"
    )
    workload = Workload(ReplayArrivals(str(path), time_scale=0.5), TraceLengths(str(path), "in-order"))
    requests = generate(workload)
    assert [r.arrival_time_s for r in requests] == [0.0, 0.5, 2.0]
    assert [(r.num_prompt_tokens, r.max_tokens) for r in requests] == [(5, 1), (6, 2), (7, 3)]
    with pytest.raises(ValueError, match="3 rows"):
        generate(workload, 4)


def test_replay_needs_arrival_column() -> None:
    with pytest.raises(ValueError, match="no arrived_at"):
        generate(Workload(ReplayArrivals("sharegpt"), FixedLengths(1, 1)), 5)


# --- lengths and caps --------------------------------------------------------------------------


def test_same_seed_same_requests_and_lengths_independent_of_qps() -> None:
    slow = Workload(poisson(1.0), TraceLengths("arxiv"))
    assert generate(slow, 500, seed=7) == generate(slow, 500, seed=7)
    assert generate(slow, 500, seed=7) != generate(slow, 500, seed=8)
    fast = Workload(poisson(9.0), TraceLengths("arxiv"))
    assert [r.num_prompt_tokens for r in generate(slow, 50, 3)] == [
        r.num_prompt_tokens for r in generate(fast, 50, 3)
    ]


def test_iterator_matches_list_and_ids_count_up() -> None:
    workload = Workload(poisson(2.0), UniformLengths(10, 20, 1, 5))
    requests = generate(workload, 9000, seed=0)
    assert list(iter_requests(workload, 9000, seed=0)) == requests
    assert [r.request_id for r in requests[:3]] == ["0", "1", "2"]
    assert all(10 <= r.num_prompt_tokens <= 20 and 1 <= r.max_tokens <= 5 for r in requests)
    assert {r.num_prompt_tokens for r in requests} == set(range(10, 21))


def test_without_replacement_uses_distinct_rows(tmp_path: Path) -> None:
    rows = "".join(f"{i},{i}\n" for i in range(1, 11))
    path = write(tmp_path / "t.csv", "num_prefill_tokens,num_decode_tokens\n" + rows)
    requests = generate(Workload(AllAtOnce(), TraceLengths(str(path), "without-replacement")), 10, seed=3)
    assert sorted(r.num_prompt_tokens for r in requests) == list(range(1, 11))
    with pytest.raises(ValueError, match="10 rows"):
        generate(Workload(AllAtOnce(), TraceLengths(str(path), "without-replacement")), 11)


def test_lognormal_median_and_clip() -> None:
    lengths = LognormalLengths(1000, 100, sigma=1.0, max_prompt_tokens=4000, max_output_tokens=300)
    prompts, outputs = lengths.sample(20_000, np.random.default_rng(0))
    assert np.median(prompts) == pytest.approx(1000, rel=0.05)
    assert prompts.max() == 4000 and outputs.max() == 300 and outputs.min() >= 1


def test_caps_shorten_and_never_drop() -> None:
    prompts, outputs = cap_lengths(np.array([100, 5000, 9000]), np.array([50, 800, 10]), 6000, 4096)
    assert prompts.tolist() == [100, 4095, 4095]
    assert outputs.tolist() == [50, 1, 1]
    requests = generate(Workload(AllAtOnce(), TraceLengths("sharegpt"), max_total_tokens=4096), 2000, seed=0)
    assert len(requests) == 2000
    assert max(r.num_prompt_tokens + r.max_tokens for r in requests) == 4096


# --- options (what the CLI passes) -------------------------------------------------------------


def test_options_build_the_documented_workloads() -> None:
    assert workload_from_options(WorkloadOptions(arrival="poisson", qps=4, lengths="sharegpt")) == Workload(
        poisson(4), TraceLengths("sharegpt")
    )
    assert workload_from_options(WorkloadOptions(trace="splitwise-code")) == Workload(
        ReplayArrivals("splitwise-code"), TraceLengths("splitwise-code", "in-order")
    )
    built = workload_from_options(
        WorkloadOptions(arrival="gamma", qps=2, burstiness=0.5, prompt_tokens=64, output_tokens=8)
    )
    assert built == Workload(gamma(2, 0.5), FixedLengths(64, 8))
    # A command line's default burstiness of 1 is fine with poisson (it is gamma with burstiness 1).
    poisson_default = WorkloadOptions(arrival="poisson", qps=4, burstiness=1.0, lengths="sharegpt")
    assert workload_from_options(poisson_default).arrivals == poisson(4)
    assert parse_lengths("uniform:10-20,1-5") == UniformLengths(10, 20, 1, 5)
    assert parse_lengths("lognormal:1000,100,0.5") == LognormalLengths(1000, 100, 0.5)
    assert parse_lengths("fixed:3,4") == FixedLengths(3, 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (WorkloadOptions(lengths="sharegpt"), "needs a qps"),
        (WorkloadOptions(arrival="bursty", qps=1, lengths="arxiv"), "unknown workload"),
        (WorkloadOptions(arrival="poisson", qps=1, burstiness=2, lengths="arxiv"), "burstiness"),
        (WorkloadOptions(arrival="all-at-once", qps=1, lengths="arxiv"), "qps does not apply"),
        (WorkloadOptions(arrival="poisson", qps=1, trace="splitwise-conv"), "replays arrival"),
        (WorkloadOptions(qps=1, lengths="arxiv", prompt_tokens=3), "not both"),
        (WorkloadOptions(qps=1, prompt_tokens=3), "both prompt_tokens and output_tokens"),
        (WorkloadOptions(qps=1), "say how long"),
        (WorkloadOptions(qps=1, lengths="uniform:5,6"), "MIN-MAX"),
        (WorkloadOptions(qps=1, lengths="fixed:1"), "fixed:P,O"),
        (WorkloadOptions(qps=1, lengths="arxiv", sampling="sometimes"), "unknown sampling"),
        (WorkloadOptions(qps=-2, lengths="arxiv"), "qps"),
    ],
)
def test_options_errors_say_what_is_wrong(options: WorkloadOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        workload_from_options(options)


def test_options_missing_trace_file() -> None:
    with pytest.raises(FileNotFoundError, match=r"no/such\.csv"):
        workload_from_options(WorkloadOptions(qps=1, lengths="no/such.csv"))


def test_num_requests_required_without_an_ordered_trace() -> None:
    with pytest.raises(ValueError, match="num_requests is required"):
        generate(Workload(poisson(1.0), FixedLengths(1, 1)))
    with pytest.raises(ValueError, match="num_requests must be positive"):
        generate(Workload(poisson(1.0), FixedLengths(1, 1)), 0)


def test_shared_modules_stay_light() -> None:
    """workload and metrics are imported by the benchmark client: no torch, sim or engine."""
    code = (
        "import sys, stallfree.workload, stallfree.metrics, stallfree.metrics.io; "
        "heavy = [m for m in sys.modules if m == 'torch' or m.startswith(('stallfree.sim', 'stallfree.engine'))]; "
        "print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"

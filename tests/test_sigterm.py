"""SIGTERM takes the path of Ctrl-C (``stallfree.tune.sigint.sigterm_as_sigint``), and work that
polls stops at a clean point on either (``stop_on_signal``): in process with
``signal.raise_signal``, then on the real ``stallfree tune`` / ``sweep`` / ``simulate``, SIGTERM
sent to the CLI alone (``kill PID``) and to its whole process group: exit 143 within seconds,
no pool worker or resource tracker left, and what had finished kept."""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import pytest

from stallfree.tune.sigint import SigintGuard, deferred, sigterm_as_sigint, stop_on_signal
from tests.interrupts import interrupt
from tests.test_tune_interrupt import GRID  # the same sweep, stopped by SIGTERM instead


def term() -> None:
    signal.raise_signal(signal.SIGTERM)


def test_sigterm_raises_keyboard_interrupt_and_the_default_comes_back() -> None:
    with pytest.raises(KeyboardInterrupt), sigterm_as_sigint():
        term()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_is_held_and_recorded_as_a_ctrl_c_is() -> None:
    steps = []
    with sigterm_as_sigint():
        with pytest.raises(KeyboardInterrupt), deferred():
            term()
            steps.append("the block ran to its end")
        with SigintGuard() as guard:
            term()  # recorded only, raised at the guard's check
            assert guard.received
    assert steps == ["the block ran to its end"]


def test_sigterm_still_stops_where_sigint_is_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_as_sigint():
            term()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_decorated_handler_turns_sigterm_into_keyboard_interrupt() -> None:
    @sigterm_as_sigint()
    def handler() -> None:
        term()

    for _ in range(2):  # the decorator works for every call, not only the first
        with pytest.raises(KeyboardInterrupt):
            handler()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stop_on_signal_sets_the_flag_then_a_second_signal_raises(signum: signal.Signals) -> None:
    with sigterm_as_sigint(), stop_on_signal() as stop:
        assert not stop.is_set()
        signal.raise_signal(signum)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signum)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


TUNE = ["tune", "--num-requests", "3000", "--budgets", "256,512,1024,2048", "--workers", "2"]
TUNE += ["--cost-model", "full", "--no-progress"]  # ~20 s whole on 2 cores


@pytest.mark.parametrize("whole_group", [False, True], ids=["kill PID", "kill the group"])
def test_tune_sigterm_reaps_its_workers_and_prints_what_was_measured(whole_group: bool) -> None:
    result = interrupt(TUNE, delay_s=4.0, whole_group=whole_group, signum=signal.SIGTERM)
    assert result.returncode == 143, result.stderr
    assert result.exit_s < 5, f"{result.exit_s:.1f} s to exit"
    assert not result.survivors, f"left running: {result.survivors}"
    assert "Traceback" not in result.stderr
    assert re.search(r"^INTERRUPTED: \d of 8 \(policy, budget\) searches had finished", result.stdout, re.M)
    assert "searches cut short, capacity as far as their trials tell:" in result.stdout
    assert re.search(r"stallfree tune: interrupted; the partial result \(\d of 8 searches", result.stderr)


def test_tune_sigterm_json_is_marked_partial_with_the_trials_run() -> None:
    result = interrupt([*TUNE, "--json"], delay_s=4.0, whole_group=False, signum=signal.SIGTERM)
    assert result.returncode == 143, result.stderr
    body = json.loads(result.stdout)
    # how many trials finished in 4 s depends on the machine's load: what was kept must add up
    assert body["partial"] is True and isinstance(body["trials"], list)
    stopped = body["interrupted"]
    assert stopped["searches"] == 8 and len(stopped["unfinished"]) == 8 - stopped["searches_finished"]
    assert sum(s["num_trials"] for s in stopped["unfinished"]) <= len(body["trials"])
    assert result.stderr.rstrip().endswith("is on stdout (JSON, partial: true)")


@pytest.mark.parametrize("whole_group", [False, True], ids=["kill PID", "kill the group"])
def test_sweep_sigterm_keeps_the_finished_rows(tmp_path: Path, whole_group: bool) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    trials = tmp_path / "out" / "trials.csv"
    args = ["sweep", str(grid), "--out", str(tmp_path / "out"), "--workers", "2", "--no-progress"]

    def first_row() -> bool:
        return trials.exists() and len(trials.read_text().splitlines()) >= 2

    result = interrupt(args, ready=first_row, whole_group=whole_group, signum=signal.SIGTERM)
    assert result.returncode == 143, result.stderr
    assert result.exit_s < 5 and not result.survivors, result.stderr
    assert result.stderr == "stallfree sweep: interrupted\n"
    with trials.open(newline="") as f:
        kept = list(csv.DictReader(f))
    assert 1 <= len(kept) < 30
    assert f"INTERRUPTED: {len(kept)} finished trial" in result.stdout


# ~60 s of simulation on a quiet core, so the signal after 3 s lands while chunked runs.
SIMULATE = ["simulate", "--num-requests", "200000", "--qps", "20", "--lengths", "sharegpt"]
SIMULATE += ["--cost-model", "full", "--policy", "chunked,prefill-first"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_simulate_interrupted_writes_the_finished_requests_and_a_partial_summary(
    tmp_path: Path, signum: signal.Signals
) -> None:
    out = tmp_path / "requests.csv"
    args = [*SIMULATE, "--requests-out", str(out), "--json"]
    result = interrupt(args, delay_s=3.0, whole_group=signum == signal.SIGINT, signum=signum)
    assert result.returncode == 128 + signum, result.stderr
    assert result.exit_s < 5, f"{result.exit_s:.1f} s to exit"
    body = json.loads(result.stdout)
    assert body["partial"] is True
    stopped = body["interrupted"]
    assert stopped["policy"] == "chunked" and stopped["policies_not_run"] == ["prefill-first"]
    assert 0 < stopped["requests_finished"] < stopped["requests"] == 200_000
    summary = body["policies"]["chunked"]
    assert summary["completed"] == stopped["requests_finished"]  # none rejected at this load
    assert summary["duration"] == stopped["simulated_s"] > 0
    with (tmp_path / "requests.chunked.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == stopped["requests_finished"]
    assert all(row["finish_reason"] in ("length", "stop") for row in rows)
    assert not (tmp_path / "requests.prefill-first.csv").exists()
    assert body["outputs"] == [str(tmp_path / "requests.chunked.csv")]
    assert "stallfree simulate: interrupted; chunked stopped after" in result.stderr
    assert f"wrote {tmp_path / 'requests.chunked.csv'}" in result.stderr
    assert "Traceback" not in result.stderr


def test_simulate_interrupted_table_says_what_it_covers() -> None:
    result = interrupt(SIMULATE, delay_s=3.0, whole_group=False, signum=signal.SIGTERM)
    assert result.returncode == 143, result.stderr
    assert re.search(r"^  completed +[\d,]+$", result.stdout, re.M)  # the chunked column alone
    assert re.search(
        r"^INTERRUPTED: chunked stopped after [\d,.]+ s simulated, [\d,]+ of 200,000 requests finished",
        result.stdout,
        re.M,
    )
    assert "not run: prefill-first" in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_every_command_exits_128_plus_the_signal_with_one_line(signum: signal.Signals) -> None:
    """ui has no handling of its own: the CLI's is every command's (130 Ctrl-C, 143 SIGTERM)."""
    result = interrupt(["ui", "--port", "0"], delay_s=3.0, signum=signum)
    assert "serving on http://" in result.stdout  # stopped while it served
    assert result.returncode == 128 + signum, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "stallfree ui: interrupted"
    assert "Traceback" not in result.stderr

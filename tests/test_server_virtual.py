"""The virtual replica: the server's API over the scheduler and a cost model on the wall clock."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from stallfree.cli import main
from stallfree.core import Request, SamplingParams
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.server.launch import ServerThread, build_server, build_virtual_server
from stallfree.server.virtual import EstimateTokenizer, TrackingError, VirtualEngine
from stallfree.sim import Deployment, simulate

# A small, fast replica: ~4-15 ms steps, so a run of a few dozen steps takes well under a second.
DEPLOYMENT = Deployment(
    costs=CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"),
    serving=ServingConfig(max_num_batched_tokens=256, max_num_seqs=8),
)


def test_token_times_are_the_simulators_within_the_timers_error() -> None:
    """Same requests, same scheduler, same prices: each request's first and last token are due
    when simulate() says (from the first step's start), and leave then, never early."""
    engine = VirtualEngine(DEPLOYMENT)
    prompts = [[7 + i] * (100 + 60 * i) for i in range(6)]  # distinct prompts: no prefix hits
    outputs = [12 + 3 * i for i in range(6)]
    for i, (ids, n) in enumerate(zip(prompts, outputs, strict=True)):
        engine.add_request(str(i), sampling_params=SamplingParams(max_tokens=n), prompt_token_ids=ids)
    due: dict[str, list[float]] = {}  # a request's first and last token: when due, when out
    out_s: dict[str, list[float]] = {}
    first_start_s = None
    while engine.has_unfinished_requests():
        step = engine.step()
        now_s = time.perf_counter()
        assert step.step is not None
        due_s = engine._free_at_s  # when this step was due to end
        if first_start_s is None:
            first_start_s = due_s - step.step.result.duration_s
        for out in step.outputs:
            for times, t in ((due, due_s - first_start_s), (out_s, now_s - first_start_s)):
                times.setdefault(out.request_id, [t, t])[1] = t
    requests = [
        Request(str(i), len(p), n, 0.0) for i, (p, n) in enumerate(zip(prompts, outputs, strict=True))
    ]
    predicted = {r.request_id: r for r in simulate(requests, DEPLOYMENT).records}
    assert engine.tracking.num_steps > 20 and len(due) == 6
    for rid, (first_s, last_s) in due.items():
        assert (first_s, last_s) == pytest.approx(
            (predicted[rid].first_token_s, predicted[rid].finish_s), abs=1e-9
        ), rid
        # Each step is due when the one before it was (not when the thread woke), so the timer's
        # error does not add up over the run; how late a busy host wakes the thread is its own.
        for due_at_s, out_at_s in zip(due[rid], out_s[rid], strict=True):
            assert 0 <= out_at_s - due_at_s < 0.05, rid
    assert 0 <= engine.tracking.max_late_s < 0.05


def test_the_estimate_tokenizer_decodes_what_it_encoded_and_repeats_ids_for_repeated_text() -> None:
    tokenizer = EstimateTokenizer()
    text = "The quick brown fox jumps over the lazy dog,\n  twice."
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert 9 <= len(ids) <= 18  # about 1.3 tokens a word
    assert EstimateTokenizer.pieces("  computers x\u00a0y ") == ["  comp", "uter", "s", " x", "\u00a0y", " "]
    assert tokenizer.encode(text + " More.")[: len(ids)] == ids  # a prefix keeps its ids
    chat = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert tokenizer.decode(chat) == "<|user|>\nhi\n<|assistant|>\n"


@pytest.fixture(scope="module")
def virtual() -> Iterator[ServerThread]:
    with ServerThread(build_virtual_server(DEPLOYMENT, time_scale=4.0)) as running:
        yield running


def test_it_answers_as_the_server_does_with_the_prompt_echoed(virtual: ServerThread) -> None:
    body = {"model": "llama-3.1-8b", "prompt": "one two three four", "max_tokens": 9}
    answer = httpx.post(f"{virtual.base_url}/v1/completions", json=body, timeout=30).json()
    assert answer["usage"]["completion_tokens"] == 9 and answer["choices"][0]["finish_reason"] == "length"
    assert answer["choices"][0]["text"].startswith("one two three four")
    chat = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
    reply = httpx.post(f"{virtual.base_url}/v1/chat/completions", json=chat, timeout=30).json()
    assert reply["usage"]["completion_tokens"] == 5
    with httpx.stream("POST", f"{virtual.base_url}/v1/completions", json={**body, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 9 + 1


def test_its_metrics_are_named_as_vllms(virtual: ServerThread) -> None:
    httpx.post(
        f"{virtual.base_url}/v1/completions",
        json={"model": "llama-3.1-8b", "prompt": "a b c", "max_tokens": 3},
        timeout=30,
    )
    names = {line.split("{")[0] for line in httpx.get(f"{virtual.base_url}/metrics").text.splitlines()}
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_success_total",
    } <= names


def test_its_steps_lateness_is_a_stallfree_metric(virtual: ServerThread) -> None:
    """/metrics shows the engine's TrackingError: every step counted, the buckets cumulative, the worst."""
    httpx.post(
        f"{virtual.base_url}/v1/completions",
        json={"model": "llama-3.1-8b", "prompt": "a b c", "max_tokens": 4},
        timeout=30,
    )
    tracking = virtual.app.state.engine_thread.engine.tracking
    samples: dict[str, float] = {}
    for line in httpx.get(f"{virtual.base_url}/metrics").text.splitlines():
        if line.startswith("stallfree:virtual_step_late"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    count = samples['stallfree:virtual_step_late_seconds_count{model_name="llama-3.1-8b"}']
    assert count == tracking.num_steps >= 4
    assert samples['stallfree:virtual_step_late_seconds_bucket{le="+Inf",model_name="llama-3.1-8b"}'] == count
    within_5ms = samples['stallfree:virtual_step_late_seconds_bucket{le="0.005",model_name="llama-3.1-8b"}']
    assert within_5ms == sum(tracking.bucket_counts[:4])
    worst = samples['stallfree:virtual_step_late_max_seconds{model_name="llama-3.1-8b"}']
    assert worst == pytest.approx(tracking.max_late_s) and worst >= 0


def test_the_lateness_histogram_puts_each_step_in_its_bucket() -> None:
    tracking = TrackingError()
    for late_s in (0.0001, 0.0005, 0.003, 0.2, 9.0):
        tracking.add(late_s)
    assert tracking.bucket_counts == [2, 0, 0, 1, 0, 0, 0, 0, 1, 1]
    assert tracking.num_steps == 5 and tracking.max_late_s == 9.0
    assert tracking.mean_late_s == pytest.approx(9.2036 / 5)


BAD = [
    {"prompt": "hi", "max_tokens": -1},
    {"prompt": "hi", "temperature": -2},
    {"max_tokens": 3},
    {"model": "other", "prompt": "hi"},
    {"prompt": "hi", "max_tokens": 10**7},
]


def test_bad_input_gets_the_real_servers_answer(virtual: ServerThread) -> None:
    real_app = build_server("random:tiny", dtype="float32", device="cpu", token_budget=64, num_blocks=64)
    with ServerThread(real_app) as real:
        for body in BAD:
            theirs = httpx.post(f"{real.base_url}/v1/completions", json={"model": "random:tiny", **body})
            ours = httpx.post(f"{virtual.base_url}/v1/completions", json={"model": "llama-3.1-8b", **body})
            assert ours.status_code == theirs.status_code and 400 <= ours.status_code < 500, body
            assert set(ours.json()["error"]) == set(theirs.json()["error"])


def test_a_virtual_replica_needs_no_torch() -> None:
    code = (
        "import sys; from stallfree.server.launch import build_virtual_server; from stallfree.sim import "
        "Deployment; build_virtual_server(Deployment()); assert 'torch' not in sys.modules, 'torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulate", "--threads", "2"], "--threads is the engine's"),
        (["--simulate", "--hardware", "nope"], "unknown hardware"),
        (["--hardware", "h100-sxm"], "--hardware applies with --simulate"),
        (["--simulate", "--speculative-tokens", "2"], "needs --acceptance-rate"),
    ],
)
def test_bad_flags_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err

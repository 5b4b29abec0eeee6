"""The autoscaling simulator checked against a fleet that really scales: KEDA's rule (or Dynamo
Planner's load rule), live.

A controller here does what KEDA (driving the Kubernetes HPA) does with the rule the simulator
uses, the same :mod:`stallfree.core.autoscale` policy (``--rule``, as ``simulate --autoscale``
takes it; ``keda:running=1`` by default): every scrape (15 s) it reads each ready replica's
``/metrics`` (``stallfree:`` or, on a virtual replica, ``vllm:`` ``num_requests_running`` /
``num_requests_waiting`` / ``kv_cache_usage_perc``, and for ``dynamo-load`` the replica's
``decode_kv_tokens`` / ``queued_prompt_tokens`` / ``kv_capacity_tokens``) and asks the rule for a
count. More: it starts ``stallfree serve`` processes, and one counts as ready (routable)
once its ``/health`` answers and ``POST /add_worker?url=`` has put it in a running vllm-router's
worker list. Fewer: a starting one is killed (the newest first), else a ready one (the fewest
requests in flight first) is taken out of the router (``POST /remove_worker?url=``) and stopped
once its running and waiting gauges have read 0 twice, 0.5 s apart. Every event is logged with
its time from the run's start.

Meanwhile ``stallfree bench --scenario trace`` (in this process, so its clock is the
controller's: time 0 is the first request's send) replays a trace whose Poisson rate steps up and
down. Then ``stallfree simulate --replay`` runs the same requests through the same rule, router
policy and the start-up measured here (median, decision to routable) (virtual replicas: and the
idle HTTP path through the router, measured before the run, as ``--route-delay-ms``), and the two
are compared:
the scaling decisions (each predicted one within one scrape of the measured one?), per-window
median TTFT and TPOT (within 25%?) and lost requests.

- ``--part real``: ``stallfree serve`` replicas of a random-weight model (``--model``, default
  ``random:medium``, ~128 M parameters in fp32: 25-45 ms decode steps on a core, as a GPU's are;
  ``random:small``'s 3-4 ms steps leave the router's and client's work per streamed token, on the
  same two cores, a large share the prediction does not know), one engine thread each, pinned with
  ``taskset`` to the core fewer live replicas use (2 cores: 1-2 replicas, a core each; a third
  shares a core), predicted from ``stallfree profile --base-url`` of one such replica as served
  (pinned to core 1; ``--profile`` to reuse one, made if missing).
- ``--part virtual``: ``stallfree serve --simulate`` replicas of Llama-3.1-70B on two H100s (the
  roofline ``full`` cost model), a process each, 2-16 of them (up to 32 GPUs); predicted with the
  same model. (70B's ~20 ms decode step keeps 16 replicas' streamed chunks within what this
  machine's client can take: 16 busy 8B replicas would stream ~3,000 chunks a second.)

    make router && .venv/bin/python benchmarks/fleet/autoscale_check.py --part real      # ~12 min (the profile ~5)
    .venv/bin/python benchmarks/fleet/autoscale_check.py --part virtual                  # ~6 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import dataclasses
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stallfree.core.autoscale import Autoscaler, ReplicaMetrics
from stallfree.sim.day_report import day_windows
from stallfree.sim.deployment import Autoscale
from stallfree.workload.bench_result import load_bench_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import PYTHON_MAIN, stallfree
from common.host import loadavg as load
from common.host import log, machine
from common.servers import free_port, healthy, http_path_ms, stallfree_serve, stop, vllm_router

GAUGE = re.compile(
    r"^(?:stallfree|vllm):(num_requests_running|num_requests_waiting|kv_cache_usage_perc"
    r"|decode_kv_tokens|queued_prompt_tokens|kv_capacity_tokens)"
    r"(?:\{[^}]*\})? ([-+\d.eE]+)$",
    re.M,
)


@dataclass(frozen=True, slots=True)
class Part:
    """One check: what a replica is, how it is predicted, the traffic and the rule."""

    serve: tuple[str, ...]  # stallfree serve's flags, --port aside
    predict: tuple[str, ...]  # simulate's flags for the same replica
    phases: tuple[tuple[float, float], ...]  # (seconds, requests/s) steps of the trace
    lengths: tuple[int, int]  # prompt, output tokens
    rule: str
    min_replicas: int
    max_replicas: int
    scrape_s: float
    scale_down_window_s: float
    window_s: float
    pin: bool  # taskset each replica to a core of its own (real engines)
    hop: bool  # the idle HTTP path through the router priced as --route-delay-ms (virtual replicas)


REAL_MODEL = "random:medium"  # ~128 M parameters in fp32: 25-45 ms decode steps on a core, as a GPU's are
REAL_SERVING = ("--token-budget", "256", "--max-num-seqs", "32", "--num-blocks", "4096")
VIRTUAL_MODEL = ("--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "2", "--cost-model", "full")
VIRTUAL_SERVING = ("--token-budget", "2048", "--max-num-seqs", "256")
PARTS = {
    "real": Part(
        serve=("--dtype", "float32", "--threads", "1", *REAL_SERVING),  # --model DIR added
        predict=(*REAL_SERVING, "--enable-prefix-caching"),  # --profile added
        phases=((67, 0.5), (120, 3.0), (143, 0.5)),  # steps off the 15 s scrape grid
        lengths=(64, 96),
        rule="keda:running=4",
        min_replicas=1,
        max_replicas=2,
        scrape_s=15.0,
        scale_down_window_s=60.0,
        window_s=30.0,
        pin=True,
        hop=False,  # the served profile's prices hold the server's own path
    ),
    "virtual": Part(
        serve=("--simulate", *VIRTUAL_MODEL, *VIRTUAL_SERVING),
        predict=(*VIRTUAL_MODEL, *VIRTUAL_SERVING, "--enable-prefix-caching"),
        phases=((60, 1.5), (120, 6.0), (150, 1.5)),
        lengths=(1024, 128),
        rule="keda:running=1",
        min_replicas=2,
        max_replicas=16,
        scrape_s=15.0,
        scale_down_window_s=60.0,
        window_s=30.0,
        pin=False,
        hop=True,
    ),
}


def write_trace(path: Path, part: Part, seed: int) -> int:
    """Poisson arrivals at each phase's rate, the first at 0 s; ``arrived_at`` CSV rows."""
    rng = random.Random(seed)
    times, start_s = [0.0], 0.0
    for duration_s, qps in part.phases:
        t = max(times[-1], start_s)
        while True:
            t += rng.expovariate(qps)
            if t >= start_s + duration_s:
                break
            times.append(t)
        start_s += duration_s
    with path.open("w", newline="") as sink:
        out = csv.writer(sink)
        out.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        out.writerows([f"{t:.4f}", *part.lengths] for t in times)
    return len(times)


@dataclass(slots=True)
class Replica:
    index: int
    url: str
    proc: subprocess.Popen[bytes]
    core: int | None
    on_s: float
    state: str = "starting"  # starting, ready, draining, off
    ready_s: float | None = None
    drain_s: float | None = None
    off_s: float | None = None
    zero_reads: int = 0


@dataclass(slots=True)
class Controller:
    """KEDA's loop over real processes (see the module's docstring); times from ``t0``."""

    part: Part
    router_url: str
    out: Path
    autoscaler: Autoscaler
    http: httpx.Client
    t0: float = 0.0
    replicas: list[Replica] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    sizes: list[tuple[float, int, int, int]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, text: str) -> None:
        line = f"{self.now():8.2f} s  {text}"
        self.log_lines.append(line)
        log(f"autoscale: {line}")

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.state in ("starting", "ready")]

    def start(self) -> Replica:
        index = len(self.replicas)
        port = free_port()
        while port <= 8400:
            port = free_port()
        core = None
        prefix: list[str] = []
        if self.part.pin:
            used = [r.core for r in self.replicas if r.state != "off"]
            core = min((0, 1), key=lambda c: (used.count(c), c))
            prefix = ["taskset", "-c", str(core)]
        argv = [*prefix, sys.executable, *PYTHON_MAIN, "serve", *self.part.serve]
        argv += ["--port", str(port), "--log-level", "warning"]
        with (self.out / f"replica-{index}.log").open("wb") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        replica = Replica(index, f"http://127.0.0.1:{port}", proc, core, self.now())
        self.replicas.append(replica)
        self.say(f"replica {index} starting on port {port}" + (f", core {core}" if core is not None else ""))
        return replica

    def add(self, replica: Replica) -> None:
        """Into the router's worker list: ready from here on."""
        answer = self.http.post(f"{self.router_url}/add_worker", params={"url": replica.url}, timeout=30)
        answer.raise_for_status()
        replica.state, replica.ready_s = "ready", self.now()
        self.say(
            f"replica {replica.index} ready after {replica.ready_s - replica.on_s:.1f} s ({answer.text})"
        )

    def remove(self, replica: Replica) -> None:
        answer = self.http.post(f"{self.router_url}/remove_worker", params={"url": replica.url}, timeout=30)
        answer.raise_for_status()
        replica.state, replica.drain_s = "draining", self.now()
        self.say(f"replica {replica.index} draining ({answer.text})")

    def turn_off(self, replica: Replica, why: str) -> None:
        stop(replica.proc, 20)
        replica.state, replica.off_s = "off", self.now()
        self.say(f"replica {replica.index} {why}")

    def gauges(self, replica: Replica) -> ReplicaMetrics:
        text = self.http.get(f"{replica.url}/metrics", timeout=5).text
        values: dict[str, float] = {}
        for name, value in GAUGE.findall(text):
            values[name] = values.get(name, 0.0) + float(value)
        return ReplicaMetrics(
            int(values.get("num_requests_running", 0)),
            int(values.get("num_requests_waiting", 0)),
            values.get("kv_cache_usage_perc", 0.0),
            int(values.get("decode_kv_tokens", 0)),
            int(values.get("queued_prompt_tokens", 0)),
            int(values.get("kv_capacity_tokens", 0)),
        )

    def poll(self) -> None:
        """Starting replicas that answer join the router; drained ones stop."""
        for replica in self.replicas:
            if replica.state == "starting":
                if replica.proc.poll() is not None:
                    raise RuntimeError(f"replica {replica.index} exited with {replica.proc.returncode}")
                if healthy(replica.url):
                    self.add(replica)
            elif replica.state == "draining":
                g = self.gauges(replica)
                replica.zero_reads = replica.zero_reads + 1 if g.num_running + g.num_waiting == 0 else 0
                if replica.zero_reads >= 2:
                    self.turn_off(
                        replica, f"drained and stopped ({self.now() - (replica.drain_s or 0):.1f} s)"
                    )

    def scrape(self, at_s: float) -> None:
        """The rule on the ready replicas' gauges; start, cancel or drain to its answer."""
        ready = [r for r in self.replicas if r.state == "ready"]
        metrics = {r.index: self.gauges(r) for r in ready}
        live = self.live()
        wanted = self.autoscaler.desired(at_s, len(live), list(metrics.values()), 0)
        self.decisions.append(
            {"time_s": at_s, "current": len(live), "desired": wanted,
             "gauges": {i: [m.num_running, m.num_waiting] for i, m in metrics.items()}}
        )  # fmt: skip
        if wanted != len(live):
            self.events.append({"time_s": at_s, "current": len(live), "desired": wanted})
            self.say(f"scrape at {at_s:.0f} s: {len(live)} -> {wanted} replicas")
        for _ in range(wanted - len(live)):
            self.start()
        surplus = max(0, len(live) - wanted)
        for replica in sorted((r for r in live if r.state == "starting"), key=lambda r: -r.on_s)[:surplus]:
            self.turn_off(replica, "cancelled while starting")
            surplus -= 1
        by_load = sorted(
            (r for r in live if r.state == "ready"),
            key=lambda r: (metrics[r.index].num_running + metrics[r.index].num_waiting, r.index),
        )
        for replica in by_load[:surplus]:
            self.remove(replica)
        states = [r.state for r in self.replicas]
        self.sizes.append((at_s, states.count("starting"), states.count("ready"), states.count("draining")))

    def lifetimes(self) -> list[dict[str, Any]]:
        return [
            {"replica": r.index, "on_s": r.on_s, "ready_s": r.ready_s, "drain_s": r.drain_s, "off_s": r.off_s,
             "startup_s": None if r.ready_s is None or r.on_s <= 0 else r.ready_s - r.on_s}
            for r in self.replicas
        ]  # fmt: skip


def bench_in_thread(
    router_url: str, trace: Path, result: Path, seed: int
) -> tuple[threading.Thread, threading.Event, list[float]]:
    """``stallfree bench --scenario trace`` on its own event loop; ``first`` holds the perf_counter
    time of the first request's send (the run's time 0), ``started`` is set then."""
    import stallfree.bench.scenarios as scenarios
    from stallfree.bench.run import run_bench
    from stallfree.cli import build_parser
    from stallfree.cli.bench import _spec

    args = build_parser("bench").parse_args(
        ["bench", "--base-url", router_url, "--scenario", "trace", "--trace", str(trace), "--lengths", str(trace),
         "--sampling", "in-order", "--temperature", "0", "--seed", str(seed), "--no-progress"]
    )  # fmt: skip
    spec = _spec(args)
    started, first = threading.Event(), list[float]()
    send = getattr(scenarios, "stream_completion")  # noqa: B009 (wrapped below)

    async def stamped(*a: Any, **k: Any) -> Any:
        if not first:
            first.append(time.perf_counter())
            started.set()
        return await send(*a, **k)

    setattr(scenarios, "stream_completion", stamped)  # noqa: B010 (time 0: the first send)

    def run() -> None:
        try:
            data = asyncio.run(run_bench(spec, asyncio.Event()))
            result.write_text(json.dumps(data, indent=2) + "\n")
        finally:
            started.set()

    thread = threading.Thread(target=run, name="bench")
    thread.start()
    return thread, started, first


@contextlib.contextmanager
def fleet(part: Part, out: Path, autoscaler: Autoscaler) -> Iterator[Controller]:
    """The floor's replicas ready behind vllm-router (round_robin); all stopped on the way out."""
    with httpx.Client() as http, contextlib.ExitStack() as stack:
        first = Controller(part, "", out, autoscaler, http)
        for _ in range(part.min_replicas):
            first.start()
        try:
            while any(r.state == "starting" for r in first.replicas):
                for r in first.replicas:
                    if r.state == "starting" and healthy(r.url):
                        r.state = "ready"
                time.sleep(0.2)
            urls = [r.url for r in first.replicas]
            router = stack.enter_context(
                vllm_router(
                    [
                        "--worker-urls",
                        *urls,
                        "--policy",
                        "round_robin",
                        "--prometheus-port",
                        str(free_port()),
                    ],
                    log=out / "router.log",
                )
            )
            first.router_url = router.url
            yield first
        finally:
            for r in first.replicas:
                if r.state != "off":
                    stop(r.proc, 20)


def run_part(name: str, part: Part, out: Path, seed: int, profile: Path | None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    trace, result = out / "trace.csv", out / "bench.json"
    num = write_trace(trace, part, seed)
    autoscaler = Autoscale(
        part.rule, part.min_replicas, part.max_replicas, scrape_s=part.scrape_s,
        scale_down_window_s=part.scale_down_window_s,
    ).make()  # fmt: skip
    load_before = load()
    log(f"autoscale {name}: {num} requests over {sum(d for d, _ in part.phases):.0f} s, load {load_before}")
    with fleet(part, out, autoscaler) as control:
        hop_ms = 0.0
        if part.hop:
            idle_ms, priced_ms = http_path_ms(control.router_url, part.predict)
            hop_ms = max(0.0, idle_ms - priced_ms)
            log(
                f"autoscale {name}: idle, a 2-token prompt's TTFT {idle_ms:.2f} ms for a {priced_ms:.2f} ms step"
            )
        thread, started, first = bench_in_thread(control.router_url, trace, result, seed)
        started.wait()
        if not first:
            thread.join()
            raise RuntimeError("the bench ended before sending a request")
        control.t0 = first[0]
        for r in control.replicas:  # the floor was ready before the run: from 0 s
            r.on_s = r.ready_s = 0.0
        control.say(f"first request sent; {len(control.replicas)} replicas ready")
        next_s = part.scrape_s
        while thread.is_alive():
            control.poll()
            if control.now() >= next_s:
                control.scrape(next_s)
                next_s += part.scrape_s
            time.sleep(0.1)
        end_s = control.now()
        control.say("bench done")
        thread.join()
        for r in control.replicas:
            if r.state != "off":
                r.off_s = end_s  # on to the end; fleet() stops them on the way out
    load_after = load()
    lifetimes = control.lifetimes()
    startups = [x["startup_s"] for x in lifetimes if x["startup_s"] is not None]
    startup_s = statistics.median(startups) if startups else 30.0
    measured = load_bench_result(result)
    scale = {"sizes": control.sizes}
    measured_windows = day_windows(measured.records, scale, part.window_s)
    flags = [
        "--replay", str(result), *part.predict, *(["--profile", str(profile)] if profile else []),
        "--router", "round-robin", "--autoscale", part.rule,
        "--min-replicas", str(part.min_replicas), "--max-replicas", str(part.max_replicas),
        "--startup-s", f"{startup_s:.1f}", "--scrape-s", f"{part.scrape_s:g}",
        "--scale-down-window-s", f"{part.scale_down_window_s:g}", "--window-s", f"{part.window_s:g}",
        *(["--route-delay-ms", f"{hop_ms:.3f}"] if part.hop else []),
    ]  # fmt: skip
    text = stallfree("simulate", *flags, "--json", capture=True)
    (out / "simulate.json").write_text(text)
    sim = json.loads(text)
    summary = predicted_summary(sim)
    predicted = summary["autoscale"]
    data = measured.data
    report = {
        "part": name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": f"{load_before} -> {load_after}",
        "requests": num,
        "sent": len(data["input_lens"]),
        "completed": data.get("completed"),
        "failed": data.get("failed", 0),
        "lost_measured": num - int(data.get("completed") or 0),
        "lost_predicted": num - int(summary.get("completed") or 0),
        "startups_s": startups,
        "startup_s": startup_s,
        "route_delay_ms": hop_ms,
        "simulate": "stallfree simulate " + " ".join(flags),
        "events_measured": control.events,
        "events_predicted": predicted["events"],
        "events_within_scrape": events_match(control.events, predicted["events"], part.scrape_s),
        "windows_measured": measured_windows,
        "windows_predicted": predicted["windows"],
        "lifetimes": lifetimes,
        "log": control.log_lines,
        "decisions": control.decisions,
        "measured_median_ttft_ms": data.get("median_ttft_ms"),
        "measured_median_tpot_ms": data.get("median_tpot_ms"),
        "predicted_median_ttft_ms": summary.get("median_ttft_ms"),
        "predicted_median_tpot_ms": summary.get("median_tpot_ms"),
    }
    (out / "autoscale-check.json").write_text(json.dumps(report, indent=2))
    return report


def predicted_summary(sim: dict[str, Any]) -> dict[str, Any]:
    """The chunked policy's summary in simulate's JSON (where ``autoscale`` is)."""
    policies = sim.get("policies", sim)
    entry = policies.get("chunked") or next(iter(policies.values()))
    summary: dict[str, Any] = entry.get("summary", entry)
    return summary


def events_match(measured: list[dict[str, Any]], predicted: list[dict[str, Any]], scrape_s: float) -> bool:
    """The same decisions in the same order, each within one scrape of its measured twin."""
    if len(measured) != len(predicted):
        return False
    return all(
        m["current"] == p["current"]
        and m["desired"] == p["desired"]
        and abs(m["time_s"] - p["time_s"]) <= scrape_s
        for m, p in zip(measured, predicted, strict=True)
    )


def ratio(measured: float | None, predicted: float | None) -> str:
    if measured is None or predicted is None:
        return "-"
    return f"{measured:,.0f} / {predicted:,.0f} ({predicted / measured:.2f})" if measured else "-"


def table(report: dict[str, Any]) -> list[str]:
    def events(items: list[dict[str, Any]]) -> str:
        return ", ".join(f"{e['time_s']:.0f} s {e['current']}->{e['desired']}" for e in items) or "none"

    rows = [
        f"{report['part']}: {report['machine']}; {report['date']}; load {report['load']}",
        f"{report['requests']} requests, {report['completed']} completed, {report['failed']} failed "
        f"(lost: measured {report['lost_measured']}, predicted {report['lost_predicted']}); start-ups measured "
        f"{', '.join(f'{s:.1f}' for s in report['startups_s'])} s (median {report['startup_s']:.1f} s); "
        f"the idle HTTP path through the router {report['route_delay_ms']:.2f} ms",
        f"scaling measured:  {events(report['events_measured'])}",
        f"scaling predicted: {events(report['events_predicted'])}",
        f"each within one scrape: {report['events_within_scrape']}",
        "",
        "| window | arrivals | replicas mean meas / pred | median TTFT ms meas / pred | median TPOT ms meas / pred |",
        "|---|---:|---|---|---|",
    ]
    for m, p in zip(report["windows_measured"], report["windows_predicted"], strict=False):
        mean = "/".join("-" if x is None else f"{x:.1f}" for x in (m["replicas_mean"], p["replicas_mean"]))
        rows.append(
            f"| {m['start_s']:.0f} s | {m['arrivals']} | {mean} | {ratio(m['median_ttft_ms'], p['median_ttft_ms'])} | "
            f"{ratio(m['median_tpot_ms'], p['median_tpot_ms'])} |"
        )
    return rows


def profile_served(part: Part, model_dir: Path, profile: Path) -> None:
    """``stallfree profile --base-url`` of one replica as the fleet serves it (``taskset -c 1``): the
    server's work around each step (its scheduler loop, streaming every token) is in the prices."""
    profile.parent.mkdir(parents=True, exist_ok=True)
    with stallfree_serve(
        part.serve, log=profile.with_suffix(".log"), prefix=("taskset", "-c", "1")
    ) as server:
        stallfree("profile", "--base-url", server.url, "--max-num-batched-tokens", "256", "--max-num-seqs", "32",
                  "--model-config", str(model_dir), "--out", str(profile), "--no-progress")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=tuple(PARTS), default="real")
    parser.add_argument("--out", type=Path, default=Path("out/autoscale"))
    parser.add_argument(
        "--model", default=REAL_MODEL, help=f"real: the random-weight preset served (default {REAL_MODEL})"
    )
    parser.add_argument(
        "--profile", type=Path, help="real: the served replica's profile (default: made under --out)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rule",
        help="the part's rule instead, as simulate --autoscale takes it (keda:running=2, dynamo-load)",
    )
    parser.add_argument("--max-replicas", type=int, help="the part's ceiling instead")
    parser.add_argument("--lengths", help="the part's prompt and output tokens instead: P,O")
    parser.add_argument(
        "--phases", help="the trace's steps instead of the part's: SECONDS:QPS,... (60:1,120:6,150:1)"
    )
    args = parser.parse_args()
    part = PARTS[args.part]
    if args.phases:
        steps = tuple(tuple(float(x) for x in p.split(":")) for p in args.phases.split(","))
        part = dataclasses.replace(part, phases=tuple((d, q) for d, q in steps))
    if args.rule:
        part = dataclasses.replace(part, rule=args.rule)
    if args.max_replicas:
        part = dataclasses.replace(part, max_replicas=args.max_replicas)
    if args.lengths:
        prompt, output = (int(x) for x in args.lengths.split(","))
        part = dataclasses.replace(part, lengths=(prompt, output))
    profile = None
    if args.part == "real":
        model_dir = args.out / f"{args.model.replace(':', '-')}-fp32"
        if not (model_dir / "config.json").exists():
            stallfree("save-model", args.model, str(model_dir), "--dtype", "float32")
        part = dataclasses.replace(part, serve=("--model", str(model_dir), *part.serve))
        profile = args.profile or args.out / f"{model_dir.name}.server.json"
        if not profile.exists():
            profile_served(part, model_dir, profile)
    report = run_part(args.part, part, args.out / args.part, args.seed, profile)
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The virtual replica (``stallfree serve --simulate``) checked against the simulator, and what one core carries.

A virtual replica serves the OpenAI API with its engine replaced by the scheduler and a cost model on
the wall clock. Its promise: a client sees what ``stallfree simulate`` predicts for the same requests.
Each part starts the replicas with ``common/servers.py`` and drives them with ``stallfree bench``:

(a) one replica of llama-3.1-8b on an h100-sxm (``--cost-model measured``, Vidur's tables:
    ``--gpu-tables aiconfigurator`` for NVIDIA's, whose points not yet cached on disk take the
    package 3-25 ms each, and its first ~0.6 s, to price: steps then end that late), one deployment
    YAML (``simulate --deployment-out``) given to both sides; first the HTTP path alone (an idle
    replica's TTFT for a 2-token prompt vs its step's price); then Poisson arrivals with arXiv
    lengths at a rate that keeps it busy (5 QPS) and one near saturation (7.5 QPS; ~8.5 saturates),
    ``--num-requests`` each, and ``simulate --replay RESULT --deployment a.yaml``: measured vs
    predicted median and p99 TTFT, TPOT, ITL (the issue's target: medians within 5%), and the
    steps' lateness the replica reports (``stallfree:virtual_step_late_seconds``).
(b) the seed's long prompt: a replica of ``stallfree explain``'s deployment (llama-3.1-70b on 4 x
    a100-40gb, weights-only roofline, 256-token chunks; ``--max-model-len 17408``: prefill-first's
    step holds a whole prompt, and at the model's 128K context its activations leave no KV room) and
    ``bench --scenario long-prompt --streams 16 --prompt-tokens 16384 --stream-prompt-tokens 1016``
    (each stream at 1,024 tokens when the prompt lands): the streams' longest and median gap and the
    prompt's TTFT vs ``explain --json`` at the lengths the server counted, chunked and prefill-first.
    Prefill-first's 16 streams and prompt need more KV than the GPUs hold beside its 17K-token step;
    explain assumes they fit, so it runs twice: as sized (the scheduler queues or preempts, as a real
    server would) and with ``--num-blocks`` that hold them all (explain's assumption).
(c) capacity: N replicas in one process pinned to core 1 (``taskset -c 1 ... --replicas N``),
    each driven near its saturation by a bench process of its own, all N clients pinned to core 0;
    two deployments: (a)'s 8B at 7 QPS (~1,500 output tokens/s a replica) and llama-3.1-70b on 4 x
    h100-sxm at 1.4 QPS (~300). Per N: the steps' lateness over every replica (from their
    /metrics: share later than 1 and 5 ms, the worst), the CPU the replicas' process, the other
    processes on its core (/proc/stat) and the clients used, and each replica's measured median
    TTFT / TPOT vs ``simulate --replay`` of its own requests. One core carries N replicas while
    every step (each token leaves at its step's end) ends within 5 ms of its price. A client
    spends about as much CPU a token as the server, so the client core is reported too: where it
    is saturated, the measured latencies include the client's own queueing.
(d) the replicas behind the real vllm-router on a Mooncake slice: ``fleet/virtual_router_check.py``.

    .venv/bin/python benchmarks/fidelity/virtual_replica.py                      # a, b, c: ~20 min on 2 cores
    .venv/bin/python benchmarks/fidelity/virtual_replica.py --part a --gpu-tables aiconfigurator
    .venv/bin/python benchmarks/fidelity/virtual_replica.py --part c --capacity 70b --replicas-70b 1,4,8,16,32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.cli import stallfree, stallfree_argv
from common.host import loadavg, machine, wait_for_quiet
from common.host import log as say
from common.servers import http_path_ms, stallfree_serve

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT_A = [
    "--model",
    "llama-3.1-8b",
    "--hardware",
    "h100-sxm",
    "--cost-model",
    "measured",
    "--gpu-tables",
]
DEPLOYMENT_B = ["--model", "llama-3.1-70b", "--hardware", "a100-40gb", "--tp", "4", "--cost-model",
                "weights-only", "--max-model-len", "17408"]  # fmt: skip
EXPLAIN = ["--model", "llama-3.1-70b", "--hardware", "a100-40gb", "--tp", "4", "--cost-model", "weights-only"]
DEPLOYMENT_C70 = ["--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--cost-model", "measured",
                  "--gpu-tables"]  # fmt: skip
KEYS = [f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl") for stat in ("median", "p99")]
LATE = "stallfree:virtual_step_late_seconds"
STREAMS, PROMPT_TOKENS, STREAM_PROMPT_TOKENS, LEAD_STEPS = 16, 16384, 1016, 8
SERVER_CORE, CLIENT_CORE = 1, 0  # (c): the replicas' process, the bench clients
AMPLE_BLOCKS = 4096  # 65,536 tokens: prefill-first's streams and prompt all fit (explain's assumption)


def json_of(*args: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(stallfree(*args, "--json", capture=True))
    return body


def write_deployment(path: Path, *flags: str) -> Path:
    """``simulate FLAGS --deployment-out PATH`` (one request simulated on the way)."""
    stallfree("simulate", *flags, "--num-requests", "1", "--deployment-out", str(path), capture=True)
    return path


def bench_argv(url: str, result: Path, *args: str) -> list[str]:
    return [
        *stallfree_argv(),
        "bench",
        "--base-url",
        url,
        *args,
        "--save-result",
        str(result),
        "--no-progress",
    ]


def bench(url: str, result: Path, *args: str) -> dict[str, Any]:
    stallfree("bench", "--base-url", url, *args, "--save-result", str(result), "--no-progress")
    body: dict[str, Any] = json.loads(result.read_text())
    return body


def replay(result: Path, deployment: Path, *flags: str) -> dict[str, Any]:
    summary: dict[str, Any] = json_of(
        "simulate", "--replay", str(result), "--deployment", str(deployment), *flags
    )
    return next(iter(summary["policies"].values()))


def priced_by(log: Path) -> str:
    """What the replica says prices its steps (its start-up line)."""
    found = re.search(r"steps priced by (.*?);", log.read_text())
    return found.group(1) if found else "?"


def lateness(url: str) -> dict[str, float]:
    """The replica's step-lateness series: steps (count), sum, steps within 1 and 5 ms, the worst."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = {}
    for name, pattern in (
        ("steps", rf"^{LATE}_count\{{[^}}]*\}} (\S+)$"),
        ("sum_s", rf"^{LATE}_sum\{{[^}}]*\}} (\S+)$"),
        ("within_1ms", rf'^{LATE}_bucket\{{le="0\.001"[^}}]*\}} (\S+)$'),
        ("within_5ms", rf'^{LATE}_bucket\{{le="0\.005"[^}}]*\}} (\S+)$'),
        ("max_s", r"^stallfree:virtual_step_late_max_seconds\{[^}]*\} (\S+)$"),
    ):
        found = re.search(pattern, text, re.M)
        if found is None:
            raise RuntimeError(f"{url}/metrics has no {name} of {LATE}")
        out[name] = float(found.group(1))
    return out


def late_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Lateness over a run: steps, mean, share later than 1 and 5 ms; the worst since the start."""
    steps = after["steps"] - before["steps"]
    return {
        "steps": steps,
        "mean_ms": 1000 * (after["sum_s"] - before["sum_s"]) / steps if steps else 0.0,
        "over_1ms": 1 - (after["within_1ms"] - before["within_1ms"]) / steps if steps else 0.0,
        "over_5ms": 1 - (after["within_5ms"] - before["within_5ms"]) / steps if steps else 0.0,
        "max_ms": 1000 * after["max_s"],
    }


def error(measured: float | None, predicted: float | None) -> str:
    if not measured or predicted is None:
        return "-"
    return f"{100 * (measured / predicted - 1):+.1f}%"


def header(args: argparse.Namespace) -> str:
    return f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {loadavg()}"


# -- (a) -------------------------------------------------------------------------------------------


def part_a(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    deployment = write_deployment(out / "a.yaml", *DEPLOYMENT_A, args.gpu_tables)
    log = out / "serve-a.log"
    runs = []
    with stallfree_serve(["--simulate", "--deployment", str(deployment)], log=log) as server:
        idle_ms, priced_ms = http_path_ms(server.url, ["--deployment", str(deployment)])
        for i, qps in enumerate(args.qps):
            result = out / f"a-{qps:g}qps.json"
            before, load_before, started = lateness(server.url), loadavg(), time.perf_counter()
            measured = bench(server.url, result, "--scenario", "poisson", "--qps", f"{qps:g}", "--lengths",
                             "arxiv", "--num-requests", str(args.num_requests), "--seed", str(11 + i))  # fmt: skip
            wall_s, late = time.perf_counter() - started, late_delta(before, lateness(server.url))
            predicted = replay(result, deployment)
            # The same with the idle HTTP path as a delay before the replica's queue (--route-delay-ms).
            hop = replay(result, deployment, "--route-delay-ms", f"{idle_ms - priced_ms:.3f}")
            runs.append({"qps": qps, "wall_s": wall_s, "load": f"{load_before} -> {loadavg()}", "late": late,
                         "measured": {k: measured[k] for k in KEYS}, "predicted": {k: predicted[k] for k in KEYS},
                         "predicted_with_http": {k: hop[k] for k in KEYS},
                         "failed": measured.get("failed", 0)})  # fmt: skip
    rows = [f"(a) llama-3.1-8b on h100-sxm, steps priced by {priced_by(log)}; Poisson, arXiv lengths, "
            f"{args.num_requests} requests a run; idle, a 2-token prompt's TTFT {idle_ms:.2f} ms "
            f"for a {priced_ms:.2f} ms step: the HTTP path adds {idle_ms - priced_ms:.2f} ms", "",
            "| QPS | metric | measured ms | predicted ms | error | predicted + HTTP path | error | "
            "steps later than 1 / 5 ms, worst | wall s | load |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        late = run["late"]
        for j, key in enumerate(KEYS):
            meas, pred, hop_ms = run["measured"][key], run["predicted"][key], run["predicted_with_http"][key]
            tail = (f"{100 * late['over_1ms']:.2f}% / {100 * late['over_5ms']:.2f}% of {late['steps']:.0f}, "
                    f"{late['max_ms']:.1f} ms | {run['wall_s']:.0f} | {run['load']}") if j == 0 else "| |"  # fmt: skip
            rows.append(
                f"| {run['qps']:g} | {key[:-3]} | {meas:,.2f} | {pred:,.2f} | {error(meas, pred)} "
                f"| {hop_ms:,.2f} | {error(meas, hop_ms)} | {tail} |"
            )
    print("\n".join(rows), flush=True)
    return {"runs": runs, "priced_by": priced_by(log), "idle_ttft_ms": idle_ms, "priced_ms": priced_ms}


# -- (b) -------------------------------------------------------------------------------------------


def part_b(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    setups = [("chunked", ["--policy", "chunked", "--chunk-tokens", "256"]),
              ("prefill-first", ["--policy", "prefill-first"]),
              ("prefill-first, ample KV", ["--policy", "prefill-first", "--num-blocks", str(AMPLE_BLOCKS)])]  # fmt: skip
    runs = []
    for i, (name, flags) in enumerate(setups):
        deployment = write_deployment(out / f"b-{i}.yaml", *DEPLOYMENT_B, *flags)
        log = out / f"serve-b-{i}.log"
        with stallfree_serve(["--simulate", "--deployment", str(deployment)], log=log) as server:
            before = lateness(server.url)
            measured = bench(server.url, out / f"b-{i}.json", "--scenario", "long-prompt", "--streams", str(STREAMS),
                             "--prompt-tokens", str(PROMPT_TOKENS), "--stream-prompt-tokens",
                             str(STREAM_PROMPT_TOKENS), "--seed", str(21 + i))  # fmt: skip
            late = late_delta(before, lateness(server.url))
            blocks = re.search(r"([\d,]+) KV blocks", log.read_text())
        policy = "chunked" if name == "chunked" else "prefill-first"
        counted = int(measured["long_prompt_tokens"])
        explained = json_of("explain", *EXPLAIN, "--prompt-tokens", str(counted), "--streams", str(STREAMS),
                            "--context-tokens", str(STREAM_PROMPT_TOKENS + LEAD_STEPS), "--sweep", "256")  # fmt: skip
        runs.append({
            "setup": name, "kv_blocks": blocks.group(1) if blocks else "?", "prompt_tokens": counted, "late": late,
            "measured": {k: measured[k] for k in ("streams_max_itl_ms", "streams_median_itl_ms",
                                                  "long_prompt_ttft_ms", "long_prompt_alone_ttft_ms")},
            "predicted": {"streams_max_itl_ms": 1000 * explained["policies"][policy]["max_gap_s"],
                          "streams_median_itl_ms": 1000 * explained["policies"][policy]["median_gap_s"],
                          "long_prompt_ttft_ms": 1000 * explained["policies"][policy]["ttft_s"],
                          "long_prompt_alone_ttft_ms": 1000 * explained["prefill_alone_s"]},
            "preemptions": measured.get("num_preemptions"), "load": loadavg(),
        })  # fmt: skip
    rows = ["(b) explain's deployment as a virtual replica: llama-3.1-70b on 4 x a100-40gb, weights-only; 16 streams "
            "at 1,024 tokens, a 16,384-token prompt (counted by the server's estimate)", "",
            "| setup (KV blocks) | streams' longest gap ms (meas / explain) | median gap ms | prompt TTFT ms | "
            "prompt alone ms | steps later than 5 ms, worst | load |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        m, p = run["measured"], run["predicted"]
        cells = [f"{m[k]:,.1f} / {p[k]:,.1f} ({error(m[k], p[k])})" for k in
                 ("streams_max_itl_ms", "streams_median_itl_ms", "long_prompt_ttft_ms", "long_prompt_alone_ttft_ms")]  # fmt: skip
        late = run["late"]
        rows.append(f"| {run['setup']} ({run['kv_blocks']}; prompt {run['prompt_tokens']:,}) | " + " | ".join(cells)
                    + f" | {100 * late['over_5ms']:.1f}% of {late['steps']:.0f}, {late['max_ms']:.1f} ms | {run['load']} |")  # fmt: skip
    print("\n".join(rows), flush=True)
    return {"runs": runs}


# -- (c) -------------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_busy_s(core: int) -> float:
    """CPU seconds core ``core`` has been busy (not idle or iowait) since boot, every process's."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            ticks = [int(x) for x in line.split()[1:]]
            return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"no cpu{core} in /proc/stat")


def one_capacity_run(
    out: Path, name: str, deployment: Path, n: int, qps: float, requests: int
) -> dict[str, Any]:
    """N replicas in one process on SERVER_CORE, N bench clients on CLIENT_CORE, at once."""
    wait_for_quiet(1.5, 30)
    serve = ["--simulate", "--deployment", str(deployment)]
    pinned = ["taskset", "-c", str(SERVER_CORE)]
    with stallfree_serve(serve, log=out / f"serve-{name}-{n}.log", replicas=n, prefix=pinned) as server:
        urls = [f"http://127.0.0.1:{server.port + i}" for i in range(n)]
        before = [lateness(u) for u in urls]
        results = [out / f"{name}-{n}-{i}.json" for i in range(n)]
        load_before, started = loadavg(), time.perf_counter()
        cpu_before, core_before = cpu_s(server.pid), core_busy_s(SERVER_CORE)
        clients = []
        for i, (url, result) in enumerate(zip(urls, results, strict=True)):
            argv = bench_argv(url, result, "--scenario", "poisson", "--qps", f"{qps:g}", "--lengths", "arxiv",
                              "--num-requests", str(requests), "--seed", str(100 * n + i))  # fmt: skip
            with (out / f"{name}-{n}-{i}.log").open("wb") as sink:  # its own file: a full pipe would stall it
                clients.append(subprocess.Popen(["taskset", "-c", str(CLIENT_CORE), *argv],
                                                stdout=sink, stderr=subprocess.STDOUT))  # fmt: skip
        client_cpu_s, failed = 0.0, 0
        for proc in clients:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            client_cpu_s += usage.ru_utime + usage.ru_stime
            if proc.returncode != 0:
                failed += 1
                say(f"a bench client exited {proc.returncode} (log under {out})")
        wall_s = time.perf_counter() - started
        server_cpu_s = cpu_s(server.pid) - cpu_before
        others_s = core_busy_s(SERVER_CORE) - core_before - server_cpu_s
        late = [late_delta(b, lateness(u)) for b, u in zip(before, urls, strict=True)]
    errors: dict[str, list[float]] = {"median_ttft_ms": [], "median_tpot_ms": []}
    tokens = 0
    for result in results:
        if not result.exists():
            continue
        measured, predicted = json.loads(result.read_text()), replay(result, deployment)
        tokens += int(measured["total_output_tokens"])
        for key, found in errors.items():
            found.append(measured[key] / predicted[key] - 1)
    steps = sum(x["steps"] for x in late)
    return {
        "deployment": name, "replicas": n, "qps": qps, "wall_s": wall_s, "load": f"{load_before} -> {loadavg()}",
        "failed_clients": failed, "server_core": server_cpu_s / wall_s, "others_on_server_core": others_s / wall_s,
        "client_core": client_cpu_s / wall_s, "tokens_per_s": tokens / wall_s, "steps": steps,
        "late_mean_ms": sum(x["mean_ms"] * x["steps"] for x in late) / steps if steps else 0.0,
        "over_1ms": sum(x["over_1ms"] * x["steps"] for x in late) / steps if steps else 0.0,
        "over_5ms": sum(x["over_5ms"] * x["steps"] for x in late) / steps if steps else 0.0,
        "max_ms": max(x["max_ms"] for x in late), "errors": errors,
    }  # fmt: skip


def part_c(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    runs = []
    for name, flags, qps, requests, counts in (
        ("8b", [*DEPLOYMENT_A, args.gpu_tables], args.capacity_qps, args.capacity_requests, args.replicas),
        ("70b", [*DEPLOYMENT_C70, args.gpu_tables], args.capacity_qps_70b, args.capacity_requests_70b,
         args.replicas_70b),
    ):  # fmt: skip
        if name not in args.capacity:
            continue
        deployment = write_deployment(out / f"c-{name}.yaml", *flags)
        for n in counts:
            run = one_capacity_run(out, name, deployment, n, qps, requests)
            runs.append(run)
            say(json.dumps(run))
    rows = [f"(c) N replicas in one process on core {SERVER_CORE}, each at its rate (arXiv lengths) from a bench "
            f"client of its own, the clients on core {CLIENT_CORE}: 8b = llama-3.1-8b on h100-sxm at "
            f"{args.capacity_qps:g} QPS ({args.capacity_requests} requests), 70b = llama-3.1-70b on 4 x h100-sxm at "
            f"{args.capacity_qps_70b:g} QPS ({args.capacity_requests_70b} requests); steps priced by {args.gpu_tables}'s tables", "",
            "| deployment | replicas | output tok/s (all) | server core: ours / others' | client core | steps | "
            "later than 1 ms | later than 5 ms | worst ms | median TTFT error (median, worst) | "
            "median TPOT error (median, worst) | wall s | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        cells = []
        for key in ("median_ttft_ms", "median_tpot_ms"):
            found = sorted(run["errors"][key])
            worst = max(found, key=abs) if found else None
            cells.append(
                f"{100 * found[len(found) // 2]:+.1f}%, {100 * worst:+.1f}%" if worst is not None else "-"
            )
        rows.append(f"| {run['deployment']} | {run['replicas']} | {run['tokens_per_s']:,.0f} | "
                    f"{100 * run['server_core']:.0f}% / {100 * run['others_on_server_core']:.0f}% | "
                    f"{100 * run['client_core']:.0f}% | {run['steps']:,.0f} | {100 * run['over_1ms']:.2f}% | "
                    f"{100 * run['over_5ms']:.2f}% | {run['max_ms']:.1f} | "
                    + " | ".join(cells) + f" | {run['wall_s']:.0f} | {run['load']} |")  # fmt: skip
    print("\n".join(rows), flush=True)
    return {"runs": runs}


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", default="a,b,c", help="which parts: a, b, c (default a,b,c)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "virtual_replica")
    parser.add_argument("--num-requests", type=int, default=300, help="(a): requests a run")
    parser.add_argument("--qps", type=floats, default=[5.0, 7.5], help="(a): the runs' rates (default 5,7.5)")
    parser.add_argument(
        "--gpu-tables",
        choices=("vidur", "aiconfigurator"),
        default="vidur",
        help="(a), (c): what prices steps",
    )
    parser.add_argument("--capacity", default="8b,70b", help="(c): which deployments (default 8b,70b)")
    parser.add_argument("--replicas", type=ints, default=[1, 2, 4, 8], help="(c) 8b: N per run")
    parser.add_argument("--capacity-qps", type=float, default=7.0, help="(c) 8b: each replica's rate")
    parser.add_argument("--capacity-requests", type=int, default=240, help="(c) 8b: requests a replica")
    parser.add_argument("--replicas-70b", type=ints, default=[1, 4, 8, 16], help="(c) 70b: N per run")
    parser.add_argument("--capacity-qps-70b", type=float, default=1.4, help="(c) 70b: each replica's rate")
    parser.add_argument("--capacity-requests-70b", type=int, default=80, help="(c) 70b: requests a replica")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(header(args), flush=True)
    results: dict[str, Any] = {}
    for part, run in (("a", part_a), ("b", part_b), ("c", part_c)):
        if part in args.part.split(","):
            results[part] = run(args, args.out)
            print(flush=True)
    (args.out / "virtual-replica.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

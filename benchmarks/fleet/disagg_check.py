"""Disaggregation checked on real servers: a vLLM prefill server and a vLLM decode server behind
vllm-router's PD mode, on this CPU, predicted by ``stallfree simulate --disaggregate 1P1D``.

vLLM's CPU build has no NIXL; its ``ExampleConnector`` (shared storage) moves KV between two
processes through files: the prefill server writes each request's full KV blocks, layer by layer,
as it computes them; the decode server, given the same prompt, finds them, loads them in its next
step and computes the rest (the partial last block and the last token) before its first token.
``vllm-router --vllm-pd-disaggregation`` sends each request to the prefill server with
``max_tokens`` 1, then to the decode server, and streams the decode server's answer.

SmolLM2-135M (fp32 HF folder, as ``spec_decode_check.py`` makes it), each server at vLLM's CPU
default of 2,048 tokens a step (started with 512, the decode server crashed loading 768 stored
tokens: an IndexError in ``_prepare_inputs``), 32 sequences at most, bound to a core of its own
(``VLLM_CPU_OMP_THREADS_BIND``), prefix caching off (with it, a decode server whose own cache held part
of a prompt crashed loading the rest: a shape mismatch in the connector's injection):

1. ``stallfree profile --base-url`` of each server, started without the connector on the core it
   serves from (with it, vLLM 0.32 fails a 1-token prompt);
2. the "link": a stored request's KV files read and written again (page-cached), bytes over the
   time (the prefill server writes them inside its steps, the decode server reads them inside
   its: the simulator puts that time between the two instead);
3. through the router: Poisson traffic of ``--prompt-tokens`` prompts, 64 tokens out, one request
   at a time and at a rate near the pair's capacity; each run is predicted from the two profiles by
   ``stallfree simulate --replay RESULT --disaggregate 1P1D --kv-connector shared-storage --kv-link
   GBPS --profile DECODE --prefill-profile PREFILL``, measured and predicted side by side.

    make vllm router && .venv/bin/python benchmarks/fleet/disagg_check.py        # ~20 min on 2 cores
    .venv/bin/python benchmarks/fleet/disagg_check.py --skip-profile             # the runs again, same profiles
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree
from common.host import loadavg as load
from common.host import machine
from common.servers import vllm_router, vllm_serve
from fidelity.spec_decode_check import smollm2

BUDGET, SEQS, OUTPUT = 2048, 32, 64  # vLLM's CPU default budget: at 512, a load of more stored KV crashed it
KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms")


def empty(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def link_gb_per_s(folder: Path) -> float:
    """The files as a link: a request's KV files under ``folder`` written again and read back
    (page-cached), bytes over the two times, best of 5."""
    files = list(folder.rglob("*.safetensors"))
    if not files:
        raise RuntimeError(f"no KV files under {folder}: the prefill server stored nothing")
    size = sum(f.stat().st_size for f in files)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for f in files:
            data = f.read_bytes()
            (f.parent / (f.name + ".copy")).write_bytes(data)
        write_and_read_s = time.perf_counter() - started
        for f in files:
            (f.parent / (f.name + ".copy")).unlink()
        best = min(best, write_and_read_s)
    return size / best / 1e9


def profile(url: str, out: Path, model_dir: Path) -> None:
    stallfree("profile", "--base-url", url, "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "16",
              "--model-config", str(model_dir), "--out", str(out), "--no-progress")  # fmt: skip


def predicted(result: Path, profiles: tuple[Path, Path], gb_per_s: float, num_blocks: int) -> dict[str, Any]:
    out = stallfree("simulate", "--replay", str(result), "--disaggregate", "1P1D", "--kv-connector", "shared-storage",
                    "--kv-link", f"{gb_per_s:.3f}", "--profile", str(profiles[1]), "--prefill-profile",
                    str(profiles[0]), "--token-budget", str(BUDGET), "--max-num-seqs", str(SEQS), "--num-blocks",
                    str(num_blocks), "--no-enable-prefix-caching", "--json", capture=True)  # fmt: skip
    summary: dict[str, Any] = json.loads(out)["policies"]["disagg:1P1D"]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/disagg-check"))
    parser.add_argument("--model-dir", type=Path, default=Path("out/spec/smollm2-hf-f32"))
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--busy-qps", type=float, default=0.6, help="the busy case's rate")
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profiles under --out")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir = smollm2(args.model_dir)
    kv = (out / "kv").resolve()
    empty(kv)
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"shared_storage_path": str(kv)}}  # fmt: skip
    flags = ["--max-model-len", "4096", "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", str(SEQS),
             "--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(connector)]  # fmt: skip
    profiles = (out / "prefill.profile.json", out / "decode.profile.json")
    cases = {"one-at-a-time": ("0.05", "6"), "busy": (f"{args.busy_qps:g}", str(args.num_requests))}
    loads: dict[str, str] = {}
    cores = ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"})  # prefill, decode
    if not (args.skip_profile and all(p.exists() for p in profiles)):
        # Profiled without the connector (with it, vLLM 0.32 fails a 1-token prompt: an index
        # error in _prepare_inputs), each on the core it will serve from.
        for path, env, role in zip(profiles, cores, ("prefill", "decode"), strict=True):
            with vllm_serve(model_dir, flags[:-2], log=out / f"{role}-profiling.log", env=env) as server:
                profile(server.url, path, model_dir)
    with (
        vllm_serve(model_dir, flags, log=out / "prefill.log", env=cores[0]) as prefill,
        vllm_serve(model_dir, flags, log=out / "decode.log", env=cores[1]) as decode,
    ):
        num_blocks = (decode.kv_cache_tokens or 0) // 16
        pd = [
            "--vllm-pd-disaggregation",
            "--prefill",
            prefill.url,
            "--decode",
            decode.url,
            "--policy",
            "round_robin",
        ]
        with vllm_router(pd, log=out / "router.log") as router:
            url = router.url
            empty(kv)
            stallfree("bench", "--base-url", url, "--scenario", "poisson", "--qps", "1000", "--num-requests", "1",
                      "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", "8", "--save-result",
                      str(out / "warm-up.json"), "--no-progress")  # fmt: skip
            gb_per_s = link_gb_per_s(kv)
            for name, (qps, count) in cases.items():
                empty(kv)
                started = load()
                stallfree("bench", "--base-url", url, "--scenario", "poisson", "--qps", qps, "--num-requests", count,
                          "--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(OUTPUT), "--temperature",
                          "0", "--seed", "1", "--save-result", str(out / f"{name}.json"), "--no-progress")  # fmt: skip
                loads[name] = f"{started} -> {load()}"
    hits = sum(line.count("External Cache Hit") for line in (out / "decode.log").read_text().splitlines())
    lines = [
        f"{machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"vLLM 0.32 CPU 1P1D (ExampleConnector through {kv}) behind vllm-router --vllm-pd-disaggregation; "
        f"SmolLM2-135M fp32, {args.prompt_tokens}-token prompts, {OUTPUT} tokens out; KV files written and read at "
        f"{gb_per_s:.2f} GB/s; the decode server found stored KV {hits} times",
        "",
        "| case | " + " | ".join(f"{k} (pred / meas)" for k in KEYS) + " | load |",
        "|---|" + "---|" * (len(KEYS) + 1),
    ]
    for name in cases:
        result = out / f"{name}.json"
        measured = json.loads(result.read_text())
        pred = predicted(result, profiles, gb_per_s, num_blocks)
        cells = []
        for key in KEYS:
            p, m = pred.get(key), measured.get(key)
            cells.append("-" if p is None or m is None else f"{p:,.1f} / {m:,.1f} ({p / m:.2f})")
        lines.append(
            f"| {name} ({cases[name][1]} at {cases[name][0]}/s) | "
            + " | ".join(cells)
            + f" | {loads[name]} |"
        )
        way = pred["disaggregation"]
        lines.append(
            f"| predicted way, {name} | prefill p50 {way['median_prefill_ms']:,.1f} ms | KV p50 "
            f"{way['median_kv_transfer_ms']:,.1f} ms | decode slot p50 {way['median_decode_queue_ms']:,.1f} ms | | | |"
        )
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

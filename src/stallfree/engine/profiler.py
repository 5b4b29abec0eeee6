"""``stallfree profile``: measure the real engine on this machine into a step profile.

A :class:`ProfileGrid` covers what the scheduler produces: pure decode batches (1 ..
``max_num_seqs``) across contexts, prompt chunks across sizes and earlier context, mixed steps
(decodes + a chunk), the sampler per row by mode, the linear layers alone, and real engine
steps for the per-step cost outside the executor. Each point repeats; a point during which
other processes used more than ``busy_fraction`` of the machine's CPU is re-measured (up to
``max_attempts``, keeping the quietest attempt) and flagged ``busy`` if it never got quiet;
after five busy points in a row each point is measured once until the machine quiets down.
Two reference steps (:func:`reference_steps`: a decode batch, bound by memory, and a prompt,
bound by compute) are timed before, every ``_PROBE_EVERY`` step points and after; the finished
profile is then corrected for the machine's drift by :func:`stallfree.specs.speed.correct_drift`
(a pass over the points and their :class:`~stallfree.specs.speed.MeasuringLog`). The result is a :class:`~stallfree.specs.step_profile.StepProfile` (schema in that module).
"""

from __future__ import annotations

import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from typing import Any

import torch

from stallfree import __version__
from stallfree.core import SamplingParams, ScheduledChunk, StepPlan, ceil_div
from stallfree.engine.cpu_share import CpuMeter
from stallfree.engine.engine import LLMEngine
from stallfree.engine.model_runner import ModelRunner
from stallfree.engine.native import bf16_dot_products
from stallfree.engine.sampler import sample_tokens
from stallfree.engine.step_timing import plan_times
from stallfree.specs.speed import DRIFT_WARNING, MeasuringLog, correct_drift, reference_spread
from stallfree.specs.step_profile import (
    SAMPLING_MODES,
    LinearPoint,
    OverheadPoint,
    SamplingPoint,
    Stats,
    StepPoint,
    StepProfile,
    model_dims,
)

_PARAMS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=1.0),
    "top-p": SamplingParams(temperature=1.0, top_p=0.9),
}


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """What to measure. Decode points with more than ``max_decode_kv_tokens`` cached tokens in
    all are skipped (they would only measure memory bandwidth for minutes)."""

    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    chunk_contexts: tuple[int, ...]
    mixed_decodes: tuple[int, ...]
    mixed_decode_contexts: tuple[int, ...]
    mixed_chunk_tokens: tuple[int, ...]
    mixed_chunk_contexts: tuple[int, ...]
    sampling_rows: tuple[int, ...]
    linear_tokens: tuple[int, ...]
    overhead_rows: tuple[int, ...]
    repeats: int = 5
    max_decode_kv_tokens: int = 65536
    # Whole-prompt steps (prefill-first batches prompts up to max_model_len tokens a step):
    # ``batch_prompts`` prompts of ``batch_prompt_tokens`` each, measured with 2 repeats.
    batch_prompts: tuple[int, ...] = ()
    batch_prompt_tokens: int = 512
    # Long single prompts run whole (prefill-first's stall; chunk points stop at 1,024 tokens).
    whole_prompts: tuple[int, ...] = ()

    def step_points(self) -> Iterator[tuple[str, tuple[int, ...], tuple[tuple[int, int, bool], ...]]]:
        """(kind, decode contexts, chunks) of every step point, in measuring order."""
        for ctx in self.decode_contexts:
            for n in self.decode_batches:
                if n * ctx <= self.max_decode_kv_tokens:
                    yield "decode", (ctx,) * n, ()
        for before in self.chunk_contexts:
            for tokens in self.chunk_tokens:
                yield "prefill", (), ((tokens, before, False),)
        for dctx in self.mixed_decode_contexts:
            for n in self.mixed_decodes:
                for before in self.mixed_chunk_contexts:
                    for tokens in self.mixed_chunk_tokens:
                        # Alternate: a middle chunk (no logits) and a last chunk (samples).
                        yield "mixed", (dctx,) * n, ((tokens, before, (tokens + before) % 2 == 0),)
        for k in self.batch_prompts:
            yield "prefill", (), ((self.batch_prompt_tokens, 0, True),) * k
        for tokens in self.whole_prompts:
            yield "prefill", (), ((tokens, 0, True),)

    def num_points(self) -> int:
        return (
            sum(1 for _ in self.step_points())
            + len(self.sampling_rows) * len(SAMPLING_MODES)
            + len(self.linear_tokens)
            + len(self.overhead_rows)
        )

    def max_kv_tokens(self, block_size: int) -> int:
        """KV slots the largest step point needs (rounded up to blocks per sequence)."""

        def blocks(n: int) -> int:
            return ceil_div(n, block_size)

        most = 0
        for _kind, decodes, chunks in self.step_points():
            need = sum(blocks(c + 1) for c in decodes) + sum(blocks(n + b) for n, b, _ in chunks)
            most = max(most, need)
        return most * block_size


def default_grid(max_num_seqs: int, max_model_len: int, *, quick: bool = False) -> ProfileGrid:
    """The default grid (a few minutes for ``random:medium`` on 2 cores); ``quick``: a sparse one."""

    def upto(values: tuple[int, ...], limit: int) -> tuple[int, ...]:
        kept = tuple(v for v in values if v <= limit)
        return kept or (min(values[0], limit),)

    context_limit = max(1, max_model_len - 1)
    batches = upto((1, 2, 4, 8, 16, 32, 64, 128, 256), max_num_seqs)
    if batches[-1] != max_num_seqs and max_num_seqs <= 256:
        batches = (*batches, max_num_seqs)
    if quick:
        return ProfileGrid(
            decode_batches=tuple(dict.fromkeys((*batches[:: max(1, len(batches) // 3)], batches[-1]))),
            decode_contexts=upto((16, 512), context_limit),
            chunk_tokens=upto((16, 64, 256), context_limit),
            chunk_contexts=(0, *upto((256,), max(0, context_limit - 256))),
            mixed_decodes=upto((4,), max_num_seqs),
            mixed_decode_contexts=upto((128,), context_limit),
            mixed_chunk_tokens=upto((32, 128), context_limit),
            mixed_chunk_contexts=(0,),
            sampling_rows=(1, 8),
            linear_tokens=(1, 64),
            overhead_rows=(1, min(8, max_num_seqs)),
            repeats=3,
        )
    return ProfileGrid(
        decode_batches=tuple(dict.fromkeys(batches)),
        decode_contexts=upto((16, 256, 1024, 2048), context_limit),
        chunk_tokens=upto((8, 16, 32, 64, 128, 256, 512, 1024), context_limit),
        chunk_contexts=(0, *upto((512, 1536), max(0, context_limit - 512))),
        mixed_decodes=upto((1, 4, 16), max_num_seqs),
        mixed_decode_contexts=upto((256, 1024), context_limit),
        mixed_chunk_tokens=upto((16, 48, 128, 256), context_limit),
        mixed_chunk_contexts=(0, *upto((512,), max(0, context_limit - 256))),
        sampling_rows=(1, 4, 16, 64),
        linear_tokens=(1, 4, 16, 64, 256, 512, 2048),
        overhead_rows=tuple(dict.fromkeys(upto((1, 8, 32), max_num_seqs))),
        batch_prompts=tuple(k for k in (2, 4, 8) if k * 512 <= max_model_len),
        whole_prompts=tuple(n for n in (2048, 3072) if n <= context_limit),
    )


_PROBE_EVERY = 4  # step points between two timings of the reference steps
_LOG_EVERY = 10  # points between two progress lines when stderr is not a terminal
REFERENCE_PROMPT_TOKENS = 256


class _Measurer:
    """Runs one measurement, re-measuring while other processes keep the machine busy."""

    def __init__(self, busy_fraction: float, max_attempts: int) -> None:
        self.busy_fraction = busy_fraction
        self.max_attempts = max_attempts
        self.meter = CpuMeter()
        self.num_busy = 0
        self.num_remeasured = 0
        self._busy_streak = 0

    def __call__(self, run: Callable[[], list[float]]) -> Stats:
        best: Stats | None = None
        capacity = CpuMeter.num_cpus()
        # A machine busy point after point stays busy: re-measuring then only costs time, so
        # after five busy points in a row measure once until a quiet one comes.
        attempts = 1 if self._busy_streak >= 5 else self.max_attempts
        for attempt in range(1, attempts + 1):
            self.meter.start()
            start = time.perf_counter()
            times = run()
            wall = time.perf_counter() - start
            other = self.meter.stop()
            # /proc/stat counts in ticks (10 ms): fewer than two is below its resolution.
            busy = other is not None and other > max(
                self.busy_fraction * wall * capacity, 2 * self.meter.tick_s
            )
            stats = Stats(tuple(times), other, wall, attempt, busy)
            if best is None or _load(stats) < _load(best):
                best = stats
            if not busy:
                break
            if attempt < attempts:
                self.num_remeasured += 1
                time.sleep(0.2 * attempt)  # let a neighbour's burst pass
        assert best is not None
        best = replace(best, attempts=attempt)
        self.num_busy += best.busy
        self._busy_streak = self._busy_streak + 1 if best.busy else 0
        return best


def _load(stats: Stats) -> float:
    return 0.0 if stats.other_cpu_s is None else stats.other_cpu_s / max(stats.wall_s, 1e-9)


def synthetic_step(decode_contexts: tuple[int, ...], chunks: tuple[tuple[int, int, bool], ...]) -> StepPlan:
    """The plan of one profile point: decode ``i`` has ``decode_contexts[i]`` cached tokens; a chunk
    that does not sample knows one token more than it runs (a middle chunk of a longer prompt)."""
    planned = [ScheduledChunk(f"decode-{i}", c, 1, c + 1) for i, c in enumerate(decode_contexts)]
    for i, (n, before, samples) in enumerate(chunks):
        planned.append(ScheduledChunk(f"chunk-{i}", before, n, before + n + (0 if samples else 1)))
    return StepPlan(tuple(planned))


def reference_steps(max_num_seqs: int) -> dict[str, StepPlan]:
    """The steps a profile times throughout (and ``validate`` after its run): ``decode``, 16
    decodes (at most ``max_num_seqs``) at 256 tokens of context, bound by reading weights and KV;
    ``prompt``, one 256-token prompt, bound by compute. A shared host's two speeds drift apart:
    on a 2-vCPU VM one second's prompt step took 1.7x the decode step, another's 3.9x."""
    return {
        "decode": synthetic_step((256,) * min(16, max_num_seqs), ()),
        "prompt": synthetic_step((), ((REFERENCE_PROMPT_TOKENS, 0, True),)),
    }


def reference_times_s(runner: ModelRunner, max_num_seqs: int, repeats: int) -> dict[str, float]:
    """The median time of each of :func:`reference_steps` over ``repeats`` runs on an idle ``runner``."""
    return {
        kind: statistics.median(plan_times(runner, plan, repeats))
        for kind, plan in reference_steps(max_num_seqs).items()
    }


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """What ``stallfree profile`` (of the engine) was asked: the model and how it runs, the grid
    (None: :func:`default_grid` for ``max_num_seqs`` and the model's context, ``quick``: sparse),
    and how hard to try on a busy machine."""

    model: str = "random:medium"
    dtype: str = "auto"
    device: str | None = None
    quantization: str | None = None
    threads: int | None = None
    max_num_seqs: int = 64
    quick: bool = False
    grid: ProfileGrid | None = None
    busy_fraction: float = 0.25
    max_attempts: int = 3
    block_size: int = 16


def run_profile(
    options: ProfileOptions = ProfileOptions(),
    *,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> StepProfile:
    """Measure ``options.model`` on this machine, then correct the points for the machine's drift
    (:func:`stallfree.specs.speed.correct_drift`); see the module docstring. ``progress``: a tqdm
    bar (default: when stderr is a terminal; without one, a line through ``log`` every few points).
    A KeyboardInterrupt stops the measuring: the profile returned then holds the points measured
    so far and ``settings["partial"]``."""
    if options.threads is not None:
        if options.threads < 1:
            raise ValueError(f"threads must be positive, got {options.threads}")
        torch.set_num_threads(options.threads)
    engine = _profiling_engine(options)
    grid = options.grid or default_grid(options.max_num_seqs, engine.max_model_len, quick=options.quick)
    measure = _Measurer(options.busy_fraction, options.max_attempts)
    show = sys.stderr.isatty() if progress is None else progress
    measured, timeline = _measure(engine, grid, options, measure, show, log)
    profile = correct_drift(measured, timeline)
    if log is not None:
        _log_quality(profile, grid.num_points(), measure, options, log)
    return replace(profile, fingerprint=_fingerprint(options.model, engine))


def _profiling_engine(options: ProfileOptions) -> LLMEngine:
    """An engine whose KV cache and limits hold every point of the largest default grid."""
    sizing = options.grid or default_grid(options.max_num_seqs, 1 << 30, quick=options.quick)
    block_size = options.block_size
    num_blocks = ceil_div(sizing.max_kv_tokens(block_size), block_size) + 8
    return LLMEngine(
        options.model,
        dtype=options.dtype,
        device=options.device,
        quantization=options.quantization,
        num_blocks=max(num_blocks, ceil_div(max(sizing.overhead_rows) * 64, block_size) + 8),
        block_size=block_size,
        max_num_seqs=max(options.max_num_seqs, *sizing.overhead_rows),
        policy="chunked",
        token_budget=max(512, *sizing.overhead_rows),
        adapt_threads=False,
    )


def _measure(
    engine: LLMEngine,
    grid: ProfileGrid,
    options: ProfileOptions,
    measure: _Measurer,
    show: bool,
    log: Callable[[str], None] | None,
) -> tuple[StepProfile, MeasuringLog]:
    """Every point of ``grid`` as measured (no correction) and when each was taken, with the
    reference steps timed before, every few step points and after."""
    from tqdm import tqdm

    steps: list[StepPoint] = []
    sampling: list[SamplingPoint] = []
    linear: list[LinearPoint] = []
    overhead: list[OverheadPoint] = []
    started = time.perf_counter()
    runner, max_num_seqs = engine.model_runner, options.max_num_seqs
    # Warm up: first calls of each kernel (oneDNN primitives, allocator growth) are slow.
    for _kind, decodes, chunks in list(grid.step_points())[:: max(1, grid.num_points() // 6)]:
        plan_times(runner, synthetic_step(decodes, chunks), 1)
    timeline = MeasuringLog({kind: [] for kind in reference_steps(max_num_seqs)})

    def probe() -> None:
        start = time.perf_counter()
        for kind, seconds in reference_times_s(runner, max_num_seqs, 3).items():
            timeline.reference[kind].append(seconds)
        timeline.probe_at.append((start + time.perf_counter()) / 2)

    total = grid.num_points()

    def timed(run: Callable[[], list[float]], num_tokens: int = 0) -> Stats:
        start = time.perf_counter()
        stats = measure(run)
        timeline.point_at.append((start + time.perf_counter()) / 2)
        timeline.point_tokens.append(num_tokens)
        bar.update()
        done = len(timeline.point_at)
        if not show and log is not None and (done % _LOG_EVERY == 0 or done == total):
            log(f"profile: {done}/{total} points, {time.perf_counter() - started:.0f} s")
        return stats

    probe()
    interrupted = False
    with tqdm(total=total, disable=not show, unit="point", file=sys.stderr) as bar:
        try:
            for i, (kind, decodes, chunks) in enumerate(grid.step_points(), 1):
                plan = synthetic_step(decodes, chunks)
                repeats = grid.repeats if plan.num_tokens <= 1024 else min(2, grid.repeats)
                stats = timed(partial(plan_times, runner, plan, repeats), plan.num_tokens)
                steps.append(StepPoint(kind, decodes, chunks, stats))
                if i % _PROBE_EVERY == 0:
                    probe()
            for mode in SAMPLING_MODES:
                for rows in grid.sampling_rows:
                    stats = timed(partial(_sampling_times, engine, mode, rows, grid.repeats))
                    sampling.append(SamplingPoint(mode, rows, stats))
            for tokens in grid.linear_tokens:
                stats = timed(partial(_linear_times, engine, tokens, grid.repeats), tokens)
                linear.append(LinearPoint(tokens, stats))
            for rows in grid.overhead_rows:
                overhead.append(
                    OverheadPoint(rows, timed(partial(_overhead_times, engine, rows, grid.repeats)))
                )
        except KeyboardInterrupt:
            # Keep every point measured so far (marked partial); a timing taken as the signal
            # came, before its point was kept, is dropped.
            interrupted = True
            kept = len(steps) + len(sampling) + len(linear) + len(overhead)
            del timeline.point_at[kept:], timeline.point_tokens[kept:]
    if not interrupted:
        probe()
    spec = engine.model.spec
    profile = StepProfile(
        fingerprint={},
        model=model_dims(spec, _dtype_bytes(engine.dtype)),
        settings={
            "block_size": options.block_size,
            "num_blocks": runner.kv_cache.num_blocks,
            "max_num_seqs": max_num_seqs,
            "repeats": grid.repeats,
            "quick": options.quick,
            "busy_fraction": options.busy_fraction,
            "max_attempts": options.max_attempts,
            "elapsed_s": time.perf_counter() - started,
            "num_busy_points": measure.num_busy,
            **({"partial": True} if interrupted else {}),
        },
        steps=tuple(steps),
        sampling=tuple(sampling),
        linear=tuple(linear),
        overhead=tuple(overhead),
        model_config=spec.to_hf_config(),
    )
    return profile, timeline


def _log_quality(
    profile: StepProfile, total: int, measure: _Measurer, options: ProfileOptions, log: Callable[[str], None]
) -> None:
    """How many points were measured, how busy the machine was and how far its speed drifted."""
    settings = profile.settings
    measured = len(profile.steps) + len(profile.sampling) + len(profile.linear) + len(profile.overhead)
    log(f"measured {measured} of {total} points in {settings['elapsed_s']:.0f} s")
    if measure.num_busy:
        log(
            f"warning: {measure.num_busy} of {total} points stayed busy after {options.max_attempts} attempts "
            f"(other processes used > {options.busy_fraction:.0%} of the CPU); the profile is noisy — rerun on a quiet machine"
        )
    elif measure.num_remeasured:
        log(f"note: {measure.num_remeasured} re-measurements while the machine was busy")
    if max(settings["reference_drift"], settings["reference_prompt_drift"]) > DRIFT_WARNING:
        low, high = settings["drift_scale_range"]
        log(
            f"warning: the same reference steps took {reference_spread(settings)} over the profile: "
            "this machine's speed drifts (a shared host?); every point's times were scaled to their median "
            f"speeds (x{low:.2f}-{high:.2f}), but a run here will drift as well"
        )


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _fingerprint(model: str, engine: LLMEngine) -> dict[str, Any]:
    device = engine.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {
        "model": model,
        "model_name": engine.model.spec.name,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "dtype_bytes": _dtype_bytes(engine.dtype),
        # the matmul weights' own format where not the dtype (--quantization, or auto's bf16 weights)
        "quantization": engine.model.weights.kind if engine.model.weights.kind in ("bf16", "q8_0") else None,
        "device": device.type,
        "device_name": device_name,
        "threads": torch.get_num_threads(),
        "num_cpus": CpuMeter.num_cpus(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # the compiled kernel (stallfree.engine.native) or torch's gathers and matmuls
        "decode_attention": "compiled" if engine.model_runner.decode_kernel is not None else "torch",
        # prompt chunks: the compiled kernel's bf16 products (with bf16 weights) or torch's SDPA
        "chunk_attention": "bf16" if engine.model_runner.chunk_kernel is not None else "torch",
        # how the matmuls run: the compiled kernel's panels (fp32, q8_0, bf16; "-dot": prefill
        # rows in AVX512-BF16's pair dot products), oneDNN's packed weights, or torch's
        "linear": _linear_kind(engine),
        "fused_ops": "compiled" if engine.model.decoder_layers()[0].fused is not None else "torch",
        # all-decode steps: every layer in one compiled call, or the layers one by one from Python
        "decode_layers": "compiled" if engine.model.native_decoder is not None else "python",
        "torch": torch.__version__,
        "stallfree": __version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
    }


def _linear_kind(engine: LLMEngine) -> str:
    kind = engine.model.weights.kind or "torch"
    return f"{kind}-dot" if kind in ("bf16", "q8_0") and bf16_dot_products() else kind


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:  # noqa: PTH123 - a Linux pseudo-file
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sampling_times(engine: LLMEngine, mode: str, rows: int, repeats: int) -> list[float]:
    """The sampler on ``rows`` rows of fp32 logits, all in ``mode``."""
    vocab = engine.model.spec.vocab_size
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=generator) * 4).to(engine.device)
    params = [_PARAMS[mode]] * rows
    gens = [torch.Generator(device=engine.device).manual_seed(i) for i in range(rows)]
    sample_tokens(logits, params, gens)  # warm-up
    times = []
    for _ in range(repeats):
        _sync(engine.device)
        start = time.perf_counter()
        sample_tokens(logits, params, gens)
        _sync(engine.device)
        times.append(time.perf_counter() - start)
    return times


def _linear_times(engine: LLMEngine, num_tokens: int, repeats: int) -> list[float]:
    """Every decoder layer's four matmuls (qkv, o, gate+up, down) on ``num_tokens`` rows."""
    model, spec = engine.model, engine.model.spec
    dtype, device = engine.dtype, engine.device
    x = torch.randn(num_tokens, spec.hidden_size, dtype=dtype, device=device)
    attn = torch.randn(num_tokens, spec.q_size, dtype=dtype, device=device)
    act = torch.randn(num_tokens, spec.intermediate_size, dtype=dtype, device=device)

    linear = _linear_op(model)

    def run() -> None:
        with torch.inference_mode():
            for layer in model.decoder_layers():
                linear(x, layer.qkv_proj, layer.qkv_bias)
                linear(attn, layer.o_proj)
                linear(x, layer.gate_up_proj)
                linear(act, layer.down_proj)

    run()
    times = []
    for _ in range(repeats):
        _sync(engine.device)
        start = time.perf_counter()
        run()
        _sync(engine.device)
        times.append(time.perf_counter() - start)
    return times


def _linear_op(model: Any) -> Callable[..., torch.Tensor]:
    """The model's own matmul (pre-packed weights on CPU), wherever this version keeps it."""
    weights = getattr(model, "weights", None)
    op = getattr(weights, "linear", None) or getattr(model, "_linear", None)
    if op is None:
        return torch.nn.functional.linear
    return op  # type: ignore[no-any-return]


def _overhead_times(engine: LLMEngine, rows: int, repeats: int) -> list[float]:
    """Real engine decode steps of ``rows`` greedy requests: ``step()`` wall time minus the
    executor's (scheduling, bookkeeping and detokenising: what a step costs beyond the model)."""
    params = SamplingParams(max_tokens=4 * repeats + 16, temperature=0.0, ignore_eos=True)
    rids = [
        engine.add_request(prompt_token_ids=[5 + i % 50] * 8, sampling_params=params) for i in range(rows)
    ]
    try:
        stepped = engine.step()
        while engine.scheduler.num_waiting or (
            stepped.step is not None and stepped.step.plan.num_prefill_tokens
        ):
            stepped = engine.step()
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            stepped = engine.step()
            wall = time.perf_counter() - start
            assert stepped.step is not None
            times.append(max(0.0, wall - stepped.step.result.duration_s))
        return times[1:]
    finally:
        for rid in rids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()
        engine.model_runner.reset()  # aborted requests' tables: no plan came to drop them

"""Step prices from NVIDIA's measured kernel tables: aiconfigurator-core (the optional ``gpu`` extra).

Owns :class:`AicCostModel`, :data:`AIC_SYSTEMS` (our hardware presets -> its systems),
:func:`aic_model_id` (our presets and Hugging Face ids -> the model configs it ships) and
:func:`aic_available`. Nothing here imports the package until a model is built, so the light
install never needs it.

A step is priced op by op from the package's tables for one (model, GPU system, framework,
version, tp, and for a MoE model whether its experts are sliced over the tp GPUs or split whole
over them: expert parallelism, the package's ``moe_ep_size`` = tp), in milliseconds, summed::

    body(T)            every op of a forward pass but attention and the LM head, at T tokens (the
                       step's tokens: prompt chunks and decodes, one ragged batch): GEMMs, norms,
                       activations, MoE routing and experts, all-reduces; a step with decodes in
                       it reads the package's generation ops instead (the kernels a batch with
                       decodes runs: DeepSeek's shared experts overlap the routed ones there)
  + logits(S)          the LM head on the S rows that sample
  + sum over chunks    context attention of each prompt chunk: its n new tokens over its own
    attention(n, K)    K earlier tokens (so a long prompt's later chunks cost more); alike chunks
                       (a static batch's prompts) are one kernel, as the package prices a batch
  + decode attention   the G decodes as one batch at their mean KV length: the package's decode
    (G, mean L)        attention takes one length per batch (memory-bound, so about the sum of
                       the rows' reads; benchmarks/fidelity/aiconfigurator_check.py measures the error)
  + overhead_s         a fixed per-step constant (0 unless given): the tables time GPU kernels only

"Attention" is every attention op the package lists for the model: one per layer kind where
layers differ (sliding-window and global), and for DeepSeek's MLA the whole attention block, whose
projections run on the same tokens as its attention.

Calls are cached; the decode attention is read on a grid of KV lengths (16 points an octave,
linear between them) so a long run of steps prices at once. Invariant: :meth:`steady_durations`
equals :meth:`step_time_s` on the shifted plans, bit for bit.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import StepPlan, synthetic_plan
from stallfree.specs.hardware import HARDWARE_ALIASES

FloatArray = npt.NDArray[np.float64]
FRAMEWORKS = ("vllm", "sglang", "trtllm")
# our hardware presets -> aiconfigurator's system names (the GPUs it has measured tables for)
AIC_SYSTEMS = {
    "a100-80gb": "a100_sxm",
    "h100-sxm": "h100_sxm",
    "h200-sxm": "h200_sxm",
    "b200-sxm": "b200_sxm",
    "b300-sxm": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "l40s": "l40s",
    "rtx-pro-6000": "rtx_pro_6000_server",
}
# our model presets -> the Hugging Face ids of the configs aiconfigurator ships
AIC_MODEL_IDS = {
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
}
# short names for the configs it ships that have no preset of ours (read from its files)
AIC_SHORT_NAMES = {
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
}
GRID_POINTS_PER_OCTAVE = 16
# The most table points a memo keeps (a fleet's day: ~200,000); past it a run keeps only the points
# it priced or read, so the file follows what is run and does not grow for ever.
MEMO_POINTS = 500_000
CONTEXT_ATTENTION = ("context_attention", "context_mla_block")
GENERATION_ATTENTION = ("generation_attention", "generation_mla_block")
DESCRIBE_TOKENS = (1, 64, 256, 512, 2048, 8192)


def aic_available() -> bool:
    """Whether aiconfigurator-core is installed (``pip install "stallfree[gpu]"``)."""
    return importlib.util.find_spec("aiconfigurator_core") is not None


def shipped_model_ids() -> frozenset[str]:
    """The Hugging Face ids whose configs aiconfigurator ships (empty without the extra; only the
    package's list is cached, not whether it is installed)."""
    return _package_model_ids() if aic_available() else frozenset()


@functools.cache
def _package_model_ids() -> frozenset[str]:
    from aiconfigurator_core.sdk import common

    return frozenset(str(m) for m in common.DefaultHFModels)


def aic_model_id(model: str) -> str | None:
    """The shipped config for one of our presets or a Hugging Face id, else None."""
    model_id = AIC_MODEL_IDS.get(model) or AIC_SHORT_NAMES.get(model, model)
    # every shipped id is an org/name: a name without one is none of them (no package import)
    return model_id if "/" in model_id and model_id in shipped_model_ids() else None


def shipped_config(model: str) -> dict[str, Any] | None:
    """The Hugging Face config.json aiconfigurator ships for ``model`` (an id or one of
    :data:`AIC_SHORT_NAMES`; our presets have configs of their own)."""
    model = AIC_SHORT_NAMES.get(model, model)
    if "/" not in model or not aic_available():
        return None
    import aiconfigurator_core

    folder = Path(aiconfigurator_core.__file__).parent / "model_configs"
    path = folder / f"{model.replace('/', '--')}_config.json"
    if not path.is_file():
        return None
    config: dict[str, Any] = json.loads(path.read_text())
    return config


def aic_system(hardware_name: str) -> str | None:
    """aiconfigurator's system for one of our hardware presets (or an alias of one), else None."""
    return AIC_SYSTEMS.get(HARDWARE_ALIASES.get(hardware_name, hardware_name))


def cache_dir() -> Path:
    """Where stallfree keeps what it works out once per machine: ``$STALLFREE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/stallfree`` (``~/.cache/stallfree``)."""
    if "STALLFREE_CACHE_DIR" in os.environ:
        return Path(os.environ["STALLFREE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stallfree"


@functools.cache
def _latest_version(system: str, framework: str) -> str:
    """The newest table version the package keeps for (system, framework). Finding it parses every
    table's YAML (~0.7 s), so the answer is kept on disk per installed package version."""
    from importlib.metadata import version as installed

    path = cache_dir() / "aiconfigurator-versions.json"
    key = f"{installed('aiconfigurator-core')}/{system}/{framework}"
    try:
        known: dict[str, str] = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    from aiconfigurator_core.sdk import perf_database

    with _libyaml():
        found = perf_database.get_latest_database_version(system, framework)
    if not found:
        raise ValueError(f"aiconfigurator-core has no {framework} tables for {system}")
    known = (known if isinstance(known, dict) else {}) | {key: str(found)}
    _keep(path, json.dumps(known, indent=1, sort_keys=True).encode())
    return str(found)


def _keep(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (another process reads the old file or the new one); a
    read-only home only costs the next run the work again."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)


def _pack(points: dict[Any, float]) -> list[str]:
    """A table's points as base64 columns (each place of the keys, then the values, exact), in the
    order they were found: how memos kept them before :class:`_Kept`, and still do a table whose
    keys do not fit its codes."""
    if not points:
        return []
    columns = [array("q", column) for column in zip(*points, strict=True)]
    return [_b64(c) for c in [*columns, array("d", points.values())]]


def _b64(column: array[Any]) -> str:
    return base64.b64encode(column.tobytes()).decode()


def _as_rows(points: Any) -> bool:
    """A table kept as rows, as memos did before :func:`_pack` (an empty one is neither)."""
    return bool(points) and not isinstance(points[0], str)


def _unpack(columns: list[Any], width: int) -> dict[Any, float]:
    """:func:`_pack`'s points of keys of ``width`` ints, or a list of rows (the key's ints, the
    value) as memos kept them before; ValueError if they are not that."""
    if not columns:
        return {}
    if _as_rows(columns):
        if any(len(row) != width + 1 for row in columns):
            raise ValueError("rows of another width")
        return {tuple(int(x) for x in row[:-1]): float(row[-1]) for row in columns}
    if len(columns) != width + 1:
        raise ValueError("columns of another width")
    *keys, values = (base64.b64decode(c) for c in columns)
    return dict(zip(zip(*(array("q", k) for k in keys), strict=True), array("d", values), strict=True))


def _code(key: tuple[int, ...]) -> int | None:
    """A table key as one int64 that sorts as the key does (each int in ``63 // len(key)`` bits:
    tokens, contexts and batch sizes fit), or None if it does not fit."""
    bits = 63 // len(key)
    code = 0
    for k in key:
        if not 0 <= k < 1 << bits:
            return None
        code = code << bits | k
    return code


def _decoded(code: int, width: int) -> tuple[int, ...]:
    bits = 63 // width
    mask = (1 << bits) - 1
    return tuple((code >> (bits * (width - 1 - i))) & mask for i in range(width))


class _Kept:
    """A table's points kept on disk, sorted by :func:`_code`: found a key at a time by bisection,
    so a short run does not build a dict of a fleet's ~200,000 points (~0.25 s) to read a few."""

    __slots__ = ("_codes", "_found", "_values", "width")

    def __init__(
        self, width: int, codes: array[int] | None = None, values: array[float] | None = None
    ) -> None:
        self.width = width
        self._codes: array[int] = codes if codes is not None else array("q")
        self._values: array[float] = values if values is not None else array("d")
        self._found: dict[tuple[int, ...], float] = {}
        if len(self._codes) != len(self._values):  # (unsorted ones would only be missed, and read again)
            raise ValueError("kept points: codes and values of different lengths")

    def __len__(self) -> int:
        return len(self._codes)

    def get(self, key: tuple[int, ...]) -> float | None:
        found = self._found.get(key)
        if found is None and (code := _code(key)) is not None:
            i = bisect_left(self._codes, code)
            if i < len(self._codes) and self._codes[i] == code:
                found = self._found[key] = self._values[i]
        return found

    def points(self) -> dict[tuple[int, ...], float]:
        return {_decoded(c, self.width): v for c, v in zip(self._codes, self._values, strict=True)}

    def used(self) -> dict[tuple[int, ...], float]:
        """The kept points this process looked up."""
        return dict(self._found)

    @staticmethod
    def read(kept: dict[str, str], width: int) -> _Kept:
        return _Kept(
            width, array("q", base64.b64decode(kept["codes"])), array("d", base64.b64decode(kept["values"]))
        )

    @staticmethod
    def write(points: dict[Any, float]) -> dict[str, str] | list[str]:
        """``points`` as :meth:`read` takes them, or as :func:`_pack`'s columns if a key does not fit
        a code."""
        coded = [(_code(key), value) for key, value in points.items()]
        if any(code is None for code, _ in coded):
            return _pack(points)
        coded.sort()
        codes = array("q", [code for code, _ in coded if code is not None])
        values = array("d", [value for _, value in coded])
        return {"codes": _b64(codes), "values": _b64(values)}


def _kept_table(kept: Any, width: int, found: dict[Any, float]) -> _Kept:
    """A big table as a memo keeps it: sorted (looked up as needed), or in an older form (rows, or
    columns in the order they were found), read whole into ``found``."""
    if isinstance(kept, dict):
        return _Kept.read(kept, width)
    found.update(_unpack(kept, width))
    return _Kept(width)


def _spec_key(model_id: str, system: str, framework: str, options: dict[str, Any]) -> str:
    """A name for what prices the same: the package's version, the arguments and, for a local
    folder, its config.json."""
    from importlib.metadata import version as installed

    config = Path(model_id) / "config.json"
    key = json.dumps(
        [installed("aiconfigurator-core"), model_id, system, framework, sorted(options.items()),
         config.read_text() if config.is_file() else None],
    )  # fmt: skip
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _compiled_spec(
    model_id: str, system: str, framework: str, options: dict[str, Any], key: str, *, fresh: bool = False
) -> bytes:
    """aiconfigurator-core's compiled engine spec for the model on the system (~1 s: it resolves
    every attention kernel's table), kept on disk per machine under ``key`` (:func:`_spec_key` of
    the same arguments); ``fresh``: compile even if one is kept."""
    from aiconfigurator_core.sdk.engine import compile_engine

    path = cache_dir() / "aiconfigurator-specs" / f"{key}.bin"
    if not fresh:
        with contextlib.suppress(OSError):
            return path.read_bytes()
    with _libyaml():
        spec = compile_engine(model_id, system, framework, **options)
    _keep(path, spec)
    return spec


@contextlib.contextmanager
def _libyaml() -> Iterator[None]:
    """The package reads its tables' YAML with PyYAML's pure-Python ``safe_load``; where PyYAML has
    libyaml, its C loader of the same safe subset reads them ~10x faster (the same values)."""
    import yaml

    if not getattr(yaml, "__with_libyaml__", False):
        yield
        return
    pure = yaml.safe_load

    def fast(stream: Any) -> Any:
        return yaml.load(stream, Loader=yaml.CSafeLoader)

    yaml.safe_load = fast
    try:
        yield
    finally:
        yaml.safe_load = pure


def _quiet() -> None:
    # It logs every table it falls back on at INFO / WARNING; the pick's reason says what matters.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)


class AicCostModel:
    """Step durations of ``model_id`` on ``tp`` GPUs of ``system`` under ``framework`` (its
    ``version``: None is the newest table the package keeps for that pair), from
    aiconfigurator-core's measured op tables, in fp8 where ``fp8``; see the module docstring."""

    def __init__(
        self,
        model_id: str,
        system: str,
        framework: str = "vllm",
        version: str | None = None,
        *,
        tp: int = 1,
        expert_parallel: bool = False,
        fp8: bool = False,
        overhead_s: float = 0.0,
    ) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}")
        if not (math.isfinite(overhead_s) and overhead_s >= 0):
            raise ValueError(f"overhead_s must be >= 0, got {overhead_s!r}")
        if not aic_available():
            raise ValueError('the GPU tables need aiconfigurator-core: pip install "stallfree[gpu]"')
        if model_id not in shipped_model_ids() and not (Path(model_id) / "config.json").is_file():
            # it would fetch the config from the Hugging Face hub: stallfree downloads nothing
            raise ValueError(
                f"aiconfigurator-core ships no config for {model_id}: give one of its model ids or a "
                "local folder holding config.json"
            )
        _quiet()
        self.model_id, self.system, self.framework, self.tp = model_id, system, framework, tp
        self.version = version or _latest_version(system, framework)
        self.overhead_s = overhead_s
        self.expert_parallel = expert_parallel
        # MoE layers split as the attention does (each expert sliced over the tp GPUs) or, with
        # expert parallelism, whole experts over them; a dense model ignores the two MoE sizes.
        options: dict[str, Any] = {
            "backend_version": self.version,
            "tp_size": tp,
            "moe_tp_size": 1 if expert_parallel else tp,
            "moe_ep_size": tp if expert_parallel else 1,
        }
        self.fp8 = fp8
        if fp8:  # fp8 weights (GEMMs and experts) and KV cache; a checkpoint's own quantisation otherwise
            options |= {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "kvcache_quant_mode": "fp8"}
        self._options = options
        self._engine: Any = None
        self._key = _spec_key(model_id, system, framework, options)  # the spec's file and the points'
        # sorted tables in a file of their own (an older stallfree cannot read them); an older
        # file is read once, and its points kept in the new one
        self._memo_path = cache_dir() / "aiconfigurator-points" / f"{self._key}.sorted.json"
        memo = self._read_memo()
        try:
            context: list[str] = memo.get("context_ops") or []
            generation: list[str] = memo.get("generation_ops") or []
            if not (_names(context) and _names(generation)):
                context = _op_names(self._handle.evaluate_context_ops, batch_size=1, s=1)
                generation = _op_names(self._handle.evaluate_generation_ops, batch_size=1, s=2)
        except (ValueError, RuntimeError, KeyError, AssertionError) as exc:
            # its messages run on with the lanes it tried and the folder it read: the first clause says it
            reason = (str(exc).splitlines() or [type(exc).__name__])[0].split(": tried ")[0]
            raise ValueError(
                f"aiconfigurator-core cannot price {model_id} on {tp} x {system} under {framework} "
                f"{self.version}{' in fp8' if fp8 else ''}{', experts split whole' if expert_parallel else ''}: "
                f"{reason}"
            ) from None
        # every attention op (a model with sliding-window layers has one per kind; MLA's block
        # holds its projections too, which run on the same tokens)
        self._context_attention, self._body_ops = _split_ops(context, CONTEXT_ATTENTION, "context")
        self._decode_attention, self._decode_body_ops = _split_ops(
            generation, GENERATION_ATTENTION, "generation"
        )
        self._logits_op = generation.index("generation_logits_gemm")
        self.ops = tuple(context)
        self._generation_ops = generation
        self._body: dict[int, float] = {}
        self._decode_body: dict[int, float] = {}
        self._logits: dict[int, float] = {0: 0.0}
        self._chunk: dict[tuple[int, int, int], float] = {}
        self._decode: dict[tuple[int, int], float] = {}
        self._kept_chunk, self._kept_decode = _Kept(3), _Kept(2)  # points kept on disk, looked up as needed
        self.memo_points = MEMO_POINTS
        try:
            current = self._recall(memo)
        except (ValueError, TypeError, AttributeError, KeyError):  # a damaged file: read the tables again
            self._body, self._decode_body, self._logits, self._chunk, self._decode = {}, {}, {0: 0.0}, {}, {}
            self._kept_chunk, self._kept_decode = _Kept(3), _Kept(2)
            current = True
        # a memo that kept a big table in an older form is kept again, sorted, at exit
        self._num_memo_points = self._num_points() if current else -1
        atexit.register(self._write_memo)

    # -- the package's engine, made on the first point not kept on disk ---------------------

    @property
    def _handle(self) -> Any:
        if self._engine is None:
            from aiconfigurator_core.sdk.engine import EngineHandle

            args = (self.model_id, self.system, self.framework, self._options, self._key)
            try:
                self._engine = EngineHandle(_compiled_spec(*args))
            except ValueError:  # a damaged spec kept on disk (or none compiles): compile it again
                self._engine = EngineHandle(_compiled_spec(*args, fresh=True))
        return self._engine

    def _num_points(self) -> int:
        return (
            len(self._body)
            + len(self._decode_body)
            + len(self._logits)
            + len(self._chunk)
            + len(self._decode)
            + len(self._kept_chunk)
            + len(self._kept_decode)
        )

    def _read_memo(self) -> dict[str, Any]:
        """The table points earlier runs read for this model, system and options (their floats,
        exactly: JSON keeps a float's shortest repr); {} if none or unreadable."""
        try:
            path = self._memo_path
            if not path.exists():
                path = path.with_name(f"{self._key}.json")
            memo = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return memo if isinstance(memo, dict) else {}

    def _recall(self, memo: dict[str, Any]) -> bool:
        """Take the points ``memo`` keeps (:meth:`_write_memo`'s shape); False if it kept a big
        table in an older form (rows, or columns in the order they were found), read whole."""
        for table, name in (
            (self._body, "body"),
            (self._decode_body, "decode_body"),
            (self._logits, "logits"),
        ):
            table.update({int(k): float(v) for k, v in memo.get(name, {}).items()})
        chunk, decode = memo.get("chunk") or [], memo.get("decode") or []
        self._kept_chunk = _kept_table(chunk, 3, self._chunk)
        self._kept_decode = _kept_table(decode, 2, self._decode)
        return not any(table and isinstance(table, list) for table in (chunk, decode))

    def _write_memo(self) -> None:
        """Keep the points this process read (and those it found kept), at exit: the next run
        prices them without the package."""
        if self._num_points() == self._num_memo_points:
            return
        chunk, decode = self._kept_chunk.points() | self._chunk, self._kept_decode.points() | self._decode
        if len(chunk) + len(decode) > self.memo_points:  # past the cap: only what this run priced or read
            chunk, decode = self._kept_chunk.used() | self._chunk, self._kept_decode.used() | self._decode
        memo = {
            "context_ops": list(self.ops),
            "generation_ops": self._generation_ops,
            "body": self._body,
            "decode_body": self._decode_body,
            "logits": self._logits,
            "chunk": _Kept.write(chunk),  # a fleet's: ~200,000
            "decode": _Kept.write(decode),
        }
        _keep(self._memo_path, json.dumps(memo).encode())

    # -- the tables, in seconds ------------------------------------------------------------

    def body_s(self, num_tokens: int) -> float:
        cached = self._body.get(num_tokens)
        if cached is None:
            ops = self._handle.evaluate_context_ops(self._body_ops, batch_size=1, s=num_tokens)
            cached = self._body[num_tokens] = sum(op[1] for op in ops) * 1e-3
        return cached

    def decode_body_s(self, num_tokens: int) -> float:
        """:meth:`body_s` of a step with decodes in it, from the package's generation ops (where a
        framework runs other kernels there, as DeepSeek's overlapped experts under vLLM)."""
        cached = self._decode_body.get(num_tokens)
        if cached is None:
            ops = self._handle.evaluate_generation_ops(self._decode_body_ops, batch_size=num_tokens, s=2)
            cached = self._decode_body[num_tokens] = sum(op[1] for op in ops) * 1e-3
        return cached

    def logits_s(self, num_samples: int) -> float:
        cached = self._logits.get(num_samples)
        if cached is None:
            (op,) = self._handle.evaluate_generation_ops([self._logits_op], batch_size=num_samples, s=2)
            cached = self._logits[num_samples] = op[1] * 1e-3
        return cached

    def chunk_attention_s(self, num_tokens: int, num_before: int, count: int = 1) -> float:
        """``count`` prompt chunks of ``num_tokens`` new tokens after ``num_before`` each: one kernel."""
        key = (num_tokens, num_before, count)
        cached = self._chunk.get(key)
        if cached is None and (cached := self._kept_chunk.get(key)) is None:
            ops = self._handle.evaluate_context_ops(
                self._context_attention, batch_size=count, s=num_tokens, prefix=num_before
            )
            cached = self._chunk[key] = sum(op[1] for op in ops) * 1e-3
        return cached

    def _chunks_s(self, chunks: Counter[tuple[int, int]], steps_on: int = 0) -> float:
        """Every prompt chunk's attention, alike chunks (a static batch's prompts) priced together;
        ``steps_on``: as the chunks are that many steps later."""
        return sum(
            self.chunk_attention_s(n, before + n * steps_on, count) for (n, before), count in chunks.items()
        )

    def _decode_point(self, num_decodes: int, kv_len: int) -> float:
        key = (num_decodes, kv_len)
        cached = self._decode.get(key)
        if cached is None and (cached := self._kept_decode.get(key)) is None:
            ops = self._handle.evaluate_generation_ops(
                self._decode_attention, batch_size=num_decodes, s=kv_len
            )
            cached = self._decode[key] = sum(op[1] for op in ops) * 1e-3
        return cached

    def decode_attention_s(self, num_decodes: int, mean_kv_len: float) -> float:
        """The decodes' attention at their mean KV length, linear between grid points."""
        low, high = _grid_bracket(mean_kv_len)
        a, b = self._decode_point(num_decodes, low), self._decode_point(num_decodes, high)
        return a + (b - a) * ((mean_kv_len - low) / (high - low))

    # -- the cost-model interface ---------------------------------------------------------

    def step_time_s(self, plan: StepPlan) -> float:
        num_tokens = num_samples = num_decodes = decode_kv = 0
        chunks: Counter[tuple[int, int]] = Counter()
        for chunk in plan.chunks:
            num_tokens += chunk.num_tokens
            num_samples += chunk.emits_token
            if chunk.is_decoding:  # drafts too: verifying them reads the KV once, as a decode does
                num_decodes += 1
                decode_kv += chunk.context_len
            else:
                chunks[chunk.num_tokens, chunk.num_computed_tokens] += 1
        if num_tokens == 0:
            return 0.0
        decode_s = self.decode_attention_s(num_decodes, decode_kv / num_decodes) if num_decodes else 0.0
        body_s = self.decode_body_s(num_tokens) if num_decodes else self.body_s(num_tokens)
        return body_s + self.logits_s(num_samples) + self._chunks_s(chunks) + decode_s + self.overhead_s

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray:
        """Element ``j`` equals :meth:`step_time_s` of ``plan`` with every chunk ``j`` steps on."""
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        decodes = [c for c in plan.chunks if c.is_decode]
        prompts = Counter((c.num_tokens, c.num_computed_tokens) for c in plan.chunks if not c.is_decode)
        num_tokens = sum(c.num_tokens for c in plan.chunks)
        if num_tokens == 0:
            return np.zeros(num_steps)
        num_samples = sum(c.emits_token for c in plan.chunks)
        body_s = self.decode_body_s(num_tokens) if decodes else self.body_s(num_tokens)
        fixed = body_s + self.logits_s(num_samples)
        # a steady run has few prompt steps; each is its own table read
        chunks = np.array([self._chunks_s(prompts, j) if prompts else 0.0 for j in range(num_steps)])
        decode = np.zeros(num_steps)
        if decodes:
            kv0 = sum(c.context_len for c in decodes)
            mean = (kv0 + len(decodes) * np.arange(num_steps, dtype=np.float64)) / len(decodes)
            decode = self._decode_attention_many(len(decodes), mean)
        durations: FloatArray = fixed + chunks + decode + self.overhead_s
        return durations

    def _decode_attention_many(self, num_decodes: int, means: FloatArray) -> FloatArray:
        """:meth:`decode_attention_s` at each mean, element by element the same floats: the
        grid brackets found at once, each grid point read once."""
        floors = np.floor(means).astype(np.int64)
        small = floors < GRID_POINTS_PER_OCTAVE
        bit_length = np.frexp(np.maximum(floors, 1).astype(np.float64))[1].astype(np.int64)
        step = np.where(small, 1, np.left_shift(1, bit_length - 1) // GRID_POINTS_PER_OCTAVE)
        low = np.where(small, np.maximum(floors, 1), (floors // step) * step)
        high = low + step
        points, where = np.unique(np.concatenate((low, high)), return_inverse=True)
        values = np.array([self._decode_point(num_decodes, p) for p in points.tolist()])
        a, b = values[where[: len(means)]], values[where[len(means) :]]
        out: FloatArray = a + (b - a) * ((means - low) / (high - low))
        return out

    # -- helpers for explain / tune -------------------------------------------------------

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        return self.step_time_s(synthetic_plan(num_seqs, context_len))

    def prefill_time_s(self, num_tokens: int) -> float:
        return self.step_time_s(synthetic_plan(0, 0, num_tokens))

    def ridge_tokens(self, num_seqs: int = 16, context_len: int = 512, tolerance: float = 1.2) -> float:
        """Largest prompt chunk a ``num_seqs``-stream decode step carries at <= ``tolerance`` x the
        time it takes with a one-token chunk: the measured counterpart of the roofline's ridge.
        (The tables price a prompt chunk's attention as a kernel of its own, whose fixed cost,
        ~2 ms for Llama-3.1-70B's 80 layers, any chunk pays; the ridge is where tokens start to
        cost, so it is measured from there.)"""
        decodes = synthetic_plan(num_seqs, context_len).chunks

        def step_s(n: int) -> float:
            return self.step_time_s(StepPlan((*decodes, *synthetic_plan(0, 0, n).chunks)))

        limit = tolerance * step_s(1)
        low, high = 1, 2
        while high < 1 << 17 and step_s(high) <= limit:
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if step_s(mid) <= limit else (low, mid)
        return float(low)

    def describe(self) -> dict[str, Any]:
        """What is priced from which table, and step times by tokens per step, for ``specs``."""
        return {
            "cost_model": "measured",
            "source": f"aiconfigurator-core's {self.system} tables under {self.framework} {self.version}"
            + (", experts split whole over the GPUs (EP)" if self.expert_parallel else ""),
            "model_id": self.model_id,
            "tp": self.tp,
            "ops": list(self.ops),
            "ridge": "the chunk a 16-stream decode step at 512 tokens carries at <= 1.2x its time with a 1-token chunk",
            "overhead_s": self.overhead_s,
            "by_tokens_per_step": {str(n): {"step_s": self.prefill_time_s(n)} for n in DESCRIBE_TOKENS},
        }


def _names(value: Any) -> bool:
    """A non-empty list of strings (a memo's op names)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _grid_bracket(x: float) -> tuple[int, int]:
    """The grid points around ``x`` (>= 0): every integer up to 16, then 16 points an octave."""
    if x < GRID_POINTS_PER_OCTAVE:
        low = max(1, math.floor(x))
        return low, low + 1
    octave = 1 << (math.floor(x).bit_length() - 1)
    step = octave // GRID_POINTS_PER_OCTAVE
    low = (math.floor(x) // step) * step
    return low, low + step


def _split_ops(names: list[str], attention: tuple[str, ...], phase: str) -> tuple[list[int], list[int]]:
    """Indices of a phase's attention ops, and of the rest but its LM head (the body)."""
    body = [i for i, name in enumerate(names) if name not in attention and name != f"{phase}_logits_gemm"]
    return [i for i, name in enumerate(names) if name in attention], body


def _op_names(evaluate: Any, **kwargs: Any) -> list[str]:
    names: list[str] = []
    while True:
        try:
            (op,) = evaluate([len(names)], **kwargs)
        except ValueError:
            return names
        names.append(str(op[0]))

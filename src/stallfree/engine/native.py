"""The engine's compiled CPU kernels (``csrc/*.cpp``), fp32: decode attention, matmuls, small ops.

- ``decode_attention`` attends each single-token row over its sequence's K/V blocks where they
  lie in the paged cache, instead of copying them out first (``index_select``) as the torch path
  does.
- ``panel_linear`` multiplies by a weight packed in panels of 16 output features
  (:func:`pack_panels`), fp32 or bf16 (half the bytes: widened to fp32 as it is read, or, for 4
  rows or more on a CPU with AVX512-BF16, multiplied in bf16 pairs); it replaces oneDNN's fp32
  matmuls, for decode (one weight read per step) and prefill alike. ``q8_panel_linear`` does the
  same over int8 weights in blocks of 32 inputs with one scale each (:func:`pack_q8_panels`,
  llama.cpp's Q8_0), activations in fp32.
- ``chunk_attention`` attends a prompt chunk over its blocks in place in bf16 pair dot products
  (AVX512-BF16), for bf16 weights, whose matmuls already round prefill rows to bf16
  (:func:`chunk_kernel_for`); SDPA's fp32 flash kernel spent about twice as long on a 2K prompt.
- ``rms_norm``, ``rope_``, ``silu_mul``: the decoder layer's small ops, one call each instead of
  torch's several (:class:`FusedOps`).
- ``decode_layers``: every decoder layer of an all-decode step in one call of the kernels above
  (:func:`decode_layers_kernel`), with no Python between them.

Every function lets go of the GIL while it runs, as torch's ops do.

All are built once per machine, as one extension, with torch's JIT extension loader (gcc or
clang, and ninja), at engine start-up, never by a request; the build is cached under torch's
extension folder, named by the CPU capability it was compiled for (so a home folder shared by an
AVX-512 and an AVX2 machine holds one build for each, and neither loads the other's). Where they
cannot build (no compiler, a build error) the engine says so in one line and runs torch's ops.
``STALLFREE_NATIVE_ATTENTION=0`` / ``STALLFREE_NATIVE_LINEAR=0`` / ``STALLFREE_NATIVE_FUSED=0`` /
``STALLFREE_NATIVE_DECODER=0`` turn each off; ``STALLFREE_NATIVE_BF16_DOT=0`` keeps bf16 weights'
matmuls in fp32 on a CPU with AVX512-BF16 (:func:`bf16_dot_products`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch

_log = logging.getLogger(__name__)

DecodeKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]
"""(q [n, heads * D], key cache, value cache, block table [n, width], context lens [n], scale)
-> [n, heads * D]"""

PanelLinear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, int], torch.Tensor]
"""(x [M, K], panels (fp32 [ceil(N / 16), K, 16] or bf16 [ceil(N / 16), ceil(K / 2), 32]), bias [N]
or None, N) -> [M, N]"""
ChunkKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float, torch.Tensor], None
]
"""(q [n, heads * D], key cache, value cache, the context's blocks [ceil((before + n) / block_size)],
before, scale, out [n, heads * D]): a prompt chunk's attention in bf16 products, written to ``out``
(q and out: rows of any stride; csrc/chunk_attention.cpp)"""
Q8PanelLinear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, int], torch.Tensor]
"""(x [M, K], int8 panels [P, ceil(K / 32), 32, 16], scales [P, ceil(K / 32), 16], bias, N) -> [M, N]"""
DecodeLayers = Callable[..., torch.Tensor]
"""(hidden [n, H], cos, sin [n, D / 2], 6 weights per layer, 4 Q8_0 scales per layer or none, a qkv
bias per layer or none, key cache, value cache [layers, ...], slots [n], block table, context lens,
q heads, intermediate size, eps, scale) -> hidden after every layer (csrc/decoder.cpp)"""

SOURCES = tuple(
    Path(__file__).with_name("csrc") / name
    for name in (
        "decode_attention.cpp",
        "linear.cpp",
        "chunk_attention.cpp",
        "elementwise.cpp",
        "decoder.cpp",
        "bindings.cpp",
    )
)
ATTENTION_ENV = "STALLFREE_NATIVE_ATTENTION"
LINEAR_ENV = "STALLFREE_NATIVE_LINEAR"
FUSED_ENV = "STALLFREE_NATIVE_FUSED"
DECODER_ENV = "STALLFREE_NATIVE_DECODER"
PANEL = 16  # output features per panel of a packed weight

# Instruction sets by torch's own reading of the CPU; never -march=native, whose build would carry
# the building machine's every extension to whichever machine finds it in the cache.
_ISA_FLAGS = {
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
}
# Reductions may reorder (so they vectorize); no fast-math at link time (it would set
# flush-to-zero for the whole process).
# -fopenmp: at::parallel_for is inline; without it the kernels run on one thread whatever
# torch.set_num_threads says (they then share torch's OpenMP pool, as its own ops do).
_CFLAGS = [
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-signed-zeros",
    "-fassociative-math",
]


STALE_LOCK_S = 600  # a build takes under a minute: a lock this old was left by a stopped start


def _load_built(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_stale_lock(lock: Path) -> None:
    """Remove torch's build lock when a stopped build left it behind (it would wait forever)."""
    try:
        age_s = time.time() - lock.stat().st_mtime
    except OSError:
        return
    if age_s > STALE_LOCK_S:
        _log.warning("note: removing a build lock left %.0f s ago by a stopped start: %s", age_s, lock)
        lock.unlink(missing_ok=True)


def enabled(env: str) -> bool:
    return os.environ.get(env, "1") != "0"


@functools.cache
def native_module() -> Any | None:
    """The extension, built or loaded from the cache; None where it cannot be (said once, in one
    line)."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = [*_CFLAGS, *_ISA_FLAGS.get(capability, [])]
    sources = [path.read_text() for path in SOURCES]
    digest = hashlib.sha256("\0".join([*sources, torch.__version__, *flags]).encode()).hexdigest()[:12]
    name = f"stallfree_native_{capability.lower()}_{digest}"
    started = time.perf_counter()
    try:
        from torch.utils.cpp_extension import _get_build_directory, load_inline

        # The name holds a digest of the sources, flags and torch: a library built under it is
        # current, and loads without torch's build lock (a start stopped while it held that lock
        # would leave every later start waiting on it).
        built = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
        if built.is_file():
            return _load_built(name, built)
        _drop_stale_lock(built.parent / "lock")
        module = load_inline(  # type: ignore[no-untyped-call]
            name,
            cpp_sources=sources,  # one file; bindings.cpp, last, binds them
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
        )
    except Exception as exc:  # no compiler or ninja, a build error: torch's ops run instead
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _log.warning("note: the engine runs torch's ops; its compiled kernels did not build (%s)", reason)
        return None
    elapsed = time.perf_counter() - started
    if elapsed > 2:
        _log.warning(
            "note: built the engine's kernels for %s in %.0f s (cached for later starts)", capability, elapsed
        )
    return module


def decode_attention_kernel() -> DecodeKernel | None:
    """The decode-attention kernel; None where the kernels cannot build or
    ``STALLFREE_NATIVE_ATTENTION=0``."""
    module = native_module() if enabled(ATTENTION_ENV) else None
    return None if module is None else cast(DecodeKernel, module.decode_attention)


def panel_linear_kernel(bf16: bool = False) -> PanelLinear | None:
    """The packed-weight matmul; None where the kernels cannot build or (fp32 panels only: bf16
    ones have no other path) ``STALLFREE_NATIVE_LINEAR=0``."""
    module = native_module() if bf16 or enabled(LINEAR_ENV) else None
    return None if module is None else cast(PanelLinear, module.panel_linear)


BF16_DOT_ENV = "STALLFREE_NATIVE_BF16_DOT"


def bf16_dot_products() -> bool:
    """Whether ``panel_linear`` over bf16 panels multiplies 4 rows or more in bf16 pairs here (a
    CPU with AVX512-BF16, the kernels built, ``STALLFREE_NATIVE_BF16_DOT`` not 0): x rounded to
    bf16, fp32 sums. Otherwise every bf16 weight is widened to fp32 and x stays fp32."""
    module = native_module()
    return module is not None and bool(module.uses_bf16_dot_products())


def chunk_attention_kernel() -> ChunkKernel | None:
    """A prompt chunk's attention in bf16 pair dot products (q, K, V and the probabilities rounded
    to bf16, fp32 softmax and sums), for engines whose matmuls already round to bf16 (bf16 panels);
    None where :func:`bf16_dot_products` is False or ``STALLFREE_NATIVE_ATTENTION=0``."""
    module = native_module() if enabled(ATTENTION_ENV) and bf16_dot_products() else None
    return None if module is None else cast(ChunkKernel, module.chunk_attention)


def q8_panel_linear_kernel() -> Q8PanelLinear | None:
    """The Q8_0 matmul; None where the kernels cannot build (``STALLFREE_NATIVE_LINEAR`` does not
    turn it off: Q8_0 weights have no other path)."""
    module = native_module()
    return None if module is None else cast(Q8PanelLinear, module.q8_panel_linear)


def decode_layers_kernel() -> DecodeLayers | None:
    """The whole-decoder call for all-decode steps; None where the kernels cannot build or
    ``STALLFREE_NATIVE_DECODER=0`` (the layers then run one by one, from Python)."""
    module = native_module() if enabled(DECODER_ENV) else None
    return None if module is None else cast(DecodeLayers, module.decode_layers)


class FusedOps(Protocol):
    """The decoder layer's small ops in one call each (``csrc/elementwise.cpp``), fp32."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def rope_(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int
    ) -> None: ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...


def fused_ops_for(device: torch.device, dtype: torch.dtype) -> FusedOps | None:
    """The fused small ops where they apply (fp32 on the CPU), else None (torch's ops);
    ``STALLFREE_NATIVE_FUSED=0`` turns them off."""
    module = native_module() if _applies(device, dtype) and enabled(FUSED_ENV) else None
    return cast(FusedOps | None, module)


def _applies(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32


def kernel_for(device: torch.device, dtype: torch.dtype) -> DecodeKernel | None:
    """The decode-attention kernel where it applies (fp32 on the CPU), else None: torch attends."""
    return decode_attention_kernel() if _applies(device, dtype) else None


def chunk_kernel_for(
    device: torch.device, dtype: torch.dtype, weights_kind: str | None, head_dim: int
) -> ChunkKernel | None:
    """The bf16 chunk attention where the matmuls already round activations to bf16 (bf16 panels
    with :func:`bf16_dot_products`, fp32 on the CPU, a head size that is a multiple of 16), else
    None: SDPA attends the chunks in fp32."""
    if weights_kind != "bf16" or not _applies(device, dtype) or head_dim % 16:
        return None
    return chunk_attention_kernel()


def linear_kernel_for(device: torch.device, dtype: torch.dtype) -> PanelLinear | None:
    """The packed-weight matmul where it applies (fp32 on the CPU), else None: oneDNN or torch."""
    return panel_linear_kernel() if _applies(device, dtype) else None


def pack_panels(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight`` ([N, K]) in panels of 16 output features, zero past N, for ``panel_linear``: fp32
    ``[ceil(N / 16), K, 16]``, or bf16 (rounded to nearest even, as torch rounds) with each
    feature's inputs in pairs, ``[ceil(N / 16), ceil(K / 2), 32]`` (zero past K)."""
    n, k = weight.shape
    w = weight.detach().to(dtype)
    if dtype == torch.float32:
        return (
            torch.nn.functional.pad(w, (0, 0, 0, -n % PANEL)).view(-1, PANEL, k).transpose(1, 2).contiguous()
        )
    padded = torch.nn.functional.pad(w, (0, k % 2, 0, -n % PANEL))  # [P * 16, 2 * pairs]
    pairs = padded.view(-1, PANEL, (k + 1) // 2, 2).transpose(1, 2)  # [P, pairs, 16, 2]
    return pairs.reshape(pairs.shape[0], pairs.shape[1], 2 * PANEL).contiguous()


Q8_BLOCK = 32  # inputs per scale of a Q8_0 weight


def pack_q8_panels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ([N, K], fp32) quantized as llama.cpp's Q8_0 and packed for ``q8_panel_linear``:
    int8 panels ``[P, ceil(K / 32), 32, 16]`` and fp32 scales ``[P, ceil(K / 32), 16]``.

    Each block of 32 inputs of a row gets ``d = max|w| / 127``, ``q = round(w / d)`` (halves away
    from zero) and keeps ``d`` rounded to fp16, as llama.cpp's quantizer does: the weights of a
    Q8_0 GGUF file, which the loader dequantizes to ``q * d``, come back as the file's own ``q``
    and ``d``, bit for bit; any other weights get the Q8_0 that llama.cpp would make of them.
    """
    n, k = weight.shape
    w = torch.nn.functional.pad(weight.detach().float(), (0, -k % Q8_BLOCK, 0, -n % PANEL))
    blocks = w.view(w.shape[0] // PANEL, PANEL, -1, Q8_BLOCK)  # [P, 16, blocks, 32]
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    scaled = blocks * inverse
    q = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8)
    panels = q.permute(0, 2, 3, 1).contiguous()  # [P, blocks, 32, 16]
    scales = d.squeeze(-1).half().float().transpose(1, 2).contiguous()  # [P, blocks, 16]
    return panels, scales

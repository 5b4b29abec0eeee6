"""Which dtype the engine runs in on this machine: the one rule behind every ``--dtype auto``.

The CPU's instruction sets are probed once (:func:`cpu_isa`: x86 flags from
``/proc/cpuinfo``, else torch's own dispatch level). ``auto`` is bf16 on CUDA; on a CPU where
the engine's compiled bf16 pair dot products run (AVX512-BF16), bf16 weights through them with
fp32 activations and KV cache; else bf16 on CPUs whose oneDNN bf16 kernels run on AVX-512
(BW/VL/DQ, which is what torch's prepacked bf16 path requires), fp32 otherwise: on an
AVX2-only CPU bf16 matmuls fall back to slow reference kernels, so fp32 (through the compiled
fp32 kernels) is the fast choice there, as vLLM's CPU backend also decides.

An explicit dtype is taken as asked once a tiny matmul in it has run on the device (a
dtype torch cannot run there is refused in one line); where it runs but without its fast
kernels, :attr:`DtypeChoice.note` says so. Whether weights can be prepacked for oneDNN is
not decided from flags: :func:`prepacks` tries it once per dtype (torch refuses bf16
without AVX-512 BW/VL/DQ or AVX-NE-CONVERT, fp16 without AVX512-FP16 or AVX-NE-CONVERT).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
# torch's prepacked (oneDNN) bf16 linear needs these three, or AVX-NE-CONVERT.
_AVX512_CORE = frozenset({"avx512bw", "avx512vl", "avx512dq"})
# torch.backends.cpu.get_cpu_capability() -> the flags that level implies, where no flags can be read.
_CAPABILITY_FLAGS = {
    "AVX512": _AVX512_CORE | {"avx512f", "avx2"},
    "AMX": _AVX512_CORE | {"avx512f", "avx2", "avx512_bf16", "amx_bf16"},
    "AVX2": frozenset({"avx2"}),
}


@dataclass(frozen=True, slots=True)
class CpuIsa:
    """The CPU's instruction-set flags (lower case, as Linux names them)."""

    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """bf16 dot products in hardware (AVX512-BF16 or AMX)."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def fast_bf16(self) -> bool:
        """oneDNN runs bf16 matmuls at speed: natively, or converted on AVX-512 BW/VL/DQ."""
        return self.native_bf16 or self.flags >= _AVX512_CORE or "avx_ne_convert" in self.flags

    @property
    def native_fp16(self) -> bool:
        return bool(self.flags & {"avx512_fp16", "amx_fp16"})

    @property
    def name(self) -> str:
        """A short description for messages: the widest vector ISA and its bf16 support."""
        if "amx_bf16" in self.flags:
            return "AMX"
        if self.flags >= _AVX512_CORE:
            return "AVX-512 with BF16" if self.native_bf16 else "AVX-512, no BF16"
        if "avx2" in self.flags:
            return "AVX2, no AVX-512"
        return "no AVX2"


@functools.cache
def cpu_isa() -> CpuIsa:
    """This machine's CPU flags, read once."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return CpuIsa(frozenset(line.split(":", 1)[1].split()))
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    return CpuIsa(_CAPABILITY_FLAGS.get(capability, frozenset()))


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The dtype the engine runs in, and why (``note``: a caveat worth a line on stderr)."""

    dtype: torch.dtype
    reason: str
    note: str | None = None
    quantization: str | None = None  # the weights' format where auto picks one (bf16 panels)

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def choose_dtype(
    name: str, device: torch.device, isa: CpuIsa | None = None, *, bf16_kernels: bool = False
) -> DtypeChoice:
    """``name`` (``auto`` or one of :data:`DTYPES`) resolved for ``device``; ``isa`` defaults to
    :func:`cpu_isa` (tests pass a fake one). ``bf16_kernels``: the engine's compiled bf16 pair
    dot products run here, so ``auto`` on the CPU is bf16 weights through them with fp32
    activations and KV cache (about twice oneDNN's bf16 decode speed, at twice its KV bytes). A
    dtype that cannot run there is a ``ValueError``."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {name!r}; choose from: {', '.join(DTYPE_CHOICES)}")
    if device.type != "cpu":
        if name == "auto":
            return DtypeChoice(torch.bfloat16, f"auto: bfloat16 on {device.type}")
        return DtypeChoice(DTYPES[name], "as asked")
    isa = isa or cpu_isa()
    if name == "auto":
        if bf16_kernels:
            return DtypeChoice(
                torch.float32,
                f"auto: bf16 weights through the compiled kernels, fp32 activations and KV cache ({isa.name}; "
                "twice the KV bytes of --dtype bfloat16, about twice its decode speed)",
                quantization="bf16",
            )
        if isa.fast_bf16:
            return DtypeChoice(torch.bfloat16, f"auto: bfloat16, this CPU runs it fast ({isa.name})")
        return DtypeChoice(torch.float32, f"auto: float32, this CPU has no fast bfloat16 ({isa.name})")
    dtype = DTYPES[name]
    failure = _cpu_failure(dtype)
    if failure is not None:
        raise ValueError(f"--dtype {name} does not run on this CPU ({isa.name}): {failure}; use float32")
    slow = (dtype == torch.bfloat16 and not isa.fast_bf16) or (dtype == torch.float16 and not isa.native_fp16)
    note = (
        f"{name} on this CPU ({isa.name}) runs on slow fallback kernels; --dtype auto picks "
        f"{'bfloat16' if isa.fast_bf16 else 'float32'}"
        if slow
        else None
    )
    return DtypeChoice(dtype, "as asked", note)


@functools.cache
def _cpu_failure(dtype: torch.dtype) -> str | None:
    """Why a tiny linear layer and attention in ``dtype`` fail on the CPU (None: they run)."""
    try:
        x = torch.ones(2, 8, dtype=dtype)
        F.linear(x, torch.ones(8, 8, dtype=dtype))
        q = x.view(1, 2, 2, 4)
        F.scaled_dot_product_attention(q, q, q)
    except RuntimeError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


@functools.cache
def prepacks(dtype: torch.dtype) -> bool:
    """Whether torch packs a ``dtype`` linear weight for oneDNN on this CPU (tried once)."""
    ops = getattr(torch.ops, "mkldnn", None)
    if ops is None or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=dtype), 16)
    except RuntimeError:
        return False
    return True

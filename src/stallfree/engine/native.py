"""The compiled decode-attention kernel (``csrc/decode_attention.cpp``) for fp32 on the CPU.

It attends each single-token row over its sequence's K/V blocks where they lie in the paged
cache, instead of copying them out first (``index_select``) as the torch path does. Built once
per machine with torch's JIT extension loader (gcc or clang, and ninja), at engine start-up,
never by a request; the build is cached under torch's extension folder, named by the CPU
capability it was compiled for (so a home folder shared by an AVX-512 and an AVX2 machine holds
one build for each, and neither loads the other's). Where it cannot build (no compiler, a build
error) the engine says so in one line and attends through torch. ``STALLFREE_NATIVE_ATTENTION=0``
turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

_log = logging.getLogger(__name__)

DecodeKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]
"""(q [n, heads * D], key cache, value cache, block table [n, width], context lens [n], scale)
-> [n, heads * D]"""

SOURCE = Path(__file__).with_name("csrc") / "decode_attention.cpp"
ENV = "STALLFREE_NATIVE_ATTENTION"

# Instruction sets by torch's own reading of the CPU; never -march=native, whose build would carry
# the building machine's every extension to whichever machine finds it in the cache.
_ISA_FLAGS = {
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
}
# Reductions may reorder (so they vectorize); no fast-math at link time (it would set
# flush-to-zero for the whole process).
_CFLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math"]


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


@functools.cache
def decode_attention_kernel() -> DecodeKernel | None:
    """The kernel, built or loaded from the cache; None where it cannot be (said once, in one
    line) or ``STALLFREE_NATIVE_ATTENTION=0``."""
    if not enabled():
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    flags = [*_CFLAGS, *_ISA_FLAGS.get(capability, [])]
    source = SOURCE.read_text()
    digest = hashlib.sha256("\0".join([source, torch.__version__, *flags]).encode()).hexdigest()[:12]
    name = f"stallfree_decode_attention_{capability.lower()}_{digest}"
    started = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load_inline

        module = load_inline(  # type: ignore[no-untyped-call]
            name, cpp_sources=source, functions=["decode_attention"], extra_cflags=flags
        )
    except Exception as exc:  # no compiler or ninja, a build error: torch's path attends instead
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _log.warning(
            "note: decode attention runs through torch; its compiled kernel did not build (%s)", reason
        )
        return None
    elapsed = time.perf_counter() - started
    if elapsed > 2:
        _log.warning(
            "note: built the decode-attention kernel for %s in %.0f s (cached for later starts)",
            capability,
            elapsed,
        )
    kernel: DecodeKernel = module.decode_attention
    return kernel


def kernel_for(device: torch.device, dtype: torch.dtype) -> DecodeKernel | None:
    """The kernel where it applies (fp32 on the CPU), else None: torch's path attends."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    return decode_attention_kernel()

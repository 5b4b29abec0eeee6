"""Inter-token latencies of a long simulated run in bounded memory.

A run adds one weighted sample ``(gap, streams)`` per step: millions for 100,000 requests.
:class:`ItlSamples` appends them raw (cheap), and whenever the buffer fills it rounds the
values to 16 significant bits (relative error below 2**-17, about 8e-6) and merges equal ones,
summing their counts. Gaps of one run span a few octaves, so the merged table stays at most a
few hundred thousand entries however long the run. Rounding is a pure function of the value,
so when the buffer happens to be merged does not change the result (the fast and the
step-by-step paths give equal samples). Values exact in 16 bits (1 s, 2 s, ...) stay exact.
"""

from __future__ import annotations

from array import array

import numpy as np
import numpy.typing as npt

from stallfree.metrics import ItlAccumulator

SIGNIFICAND_BITS = 16
_SCALE = float(2 ** (SIGNIFICAND_BITS + 1))  # frexp's mantissa is in [0.5, 1)


def round_significand(values_s: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``values_s`` rounded to :data:`SIGNIFICAND_BITS` significant bits (half away from zero)."""
    mantissa, exponent = np.frexp(values_s)
    rounded: npt.NDArray[np.float64] = np.ldexp(np.floor(mantissa * _SCALE + 0.5) / _SCALE, exponent)
    return rounded


class ItlSamples:
    """Weighted ITL samples: raw appends, rounded and merged when ``max_buffered`` pile up."""

    __slots__ = ("_counts", "_max_buffered", "_merged_counts", "_merged_values_s", "_values_s")

    def __init__(self, max_buffered: int = 1 << 18) -> None:
        self._values_s = array("d")
        self._counts = array("q")
        self._merged_values_s: npt.NDArray[np.float64] = np.zeros(0)
        self._merged_counts: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._max_buffered = max_buffered

    def add(self, value_s: float, count: int = 1) -> None:
        self._values_s.append(value_s)
        self._counts.append(count)
        if len(self._values_s) >= self._max_buffered:
            self._merge()

    def add_many(self, values_s: list[float], count: int) -> None:
        """Every value in ``values_s`` seen by ``count`` streams."""
        self._values_s.extend(values_s)
        self._counts.extend([count] * len(values_s))
        if len(self._values_s) >= self._max_buffered:
            self._merge()

    def _merge(self) -> None:
        values = np.concatenate([self._merged_values_s, round_significand(np.frombuffer(self._values_s))])
        counts = np.concatenate([self._merged_counts, np.frombuffer(self._counts, dtype=np.int64)])
        self._merged_values_s, where = np.unique(values, return_inverse=True)
        # float64 sums of whole counts are exact far beyond any run's number of tokens
        self._merged_counts = np.bincount(where, weights=counts).astype(np.int64)
        self._values_s = array("d")
        self._counts = array("q")

    def accumulator(self) -> ItlAccumulator:
        """Everything so far, rounded and merged, as :mod:`stallfree.metrics` scores it."""
        self._merge()
        acc = ItlAccumulator()
        acc.add_many(self._merged_values_s, self._merged_counts)
        return acc

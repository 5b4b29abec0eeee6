"""ITL samples in bounded memory: rounding bound, merging, order independence."""

from __future__ import annotations

import numpy as np

from stallfree.sim.itl import ItlSamples, round_significand


def test_rounding_keeps_16_significant_bits() -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(1e-4, 10.0, 10_000)
    rounded = round_significand(values)
    assert np.all(np.abs(rounded - values) <= values * 2.0**-17)
    exact = np.array([1.0, 2.0, 0.5, 3.0, 1.5])  # few significant bits: unchanged
    assert np.array_equal(round_significand(exact), exact)


def test_merging_sums_counts_whatever_the_order_and_buffer() -> None:
    rng = np.random.default_rng(1)
    values = rng.choice([0.01, 0.02, 0.5], 5000) * (1 + rng.uniform(0, 1e-7, 5000))
    counts = rng.integers(1, 40, 5000)
    small, big = ItlSamples(max_buffered=64), ItlSamples()
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        small.add(v, c)
    order = rng.permutation(5000)
    for i in order:
        big.add_many(values[i : i + 1].tolist(), int(counts[i]))
    a, b = small.accumulator(), big.accumulator()
    assert np.array_equal(a.values_s, b.values_s) and np.array_equal(a.counts, b.counts)
    assert a.num_samples == counts.sum()
    assert a.num_entries == 3  # each value within 1e-7 of one of three: one entry each

"""Roofline linear-layer time vs Vidur's measured per-operator GPU times.

Reads one of Vidur's ``mlp.csv`` profiles (per-layer operator times in ms by token count and
tensor-parallel degree; e.g. ``shared/vidur-profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv``)
and prints, for a grid of token counts, the measured time of one layer's four matmuls (QKV, O,
gate+up, down: Vidur's ``attn_pre_proj``, ``attn_post_proj``, ``mlp_up_proj``, ``mlp_down_proj``)
next to the roofline's prediction for the same weights on the same GPU:
max(2 x weights x tokens / (peak x tp), weight bytes / (bandwidth x tp)), the linear part of
:class:`stallfree.sim.CostModel`. "other ops" are the layer's norms, RoPE, activation and residual
add, which the roofline leaves out.

    python benchmarks/fidelity/roofline_vs_vidur.py ../shared/vidur-profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from stallfree.specs import load_hardware_spec, load_model_spec

MATMULS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OTHER_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
TOKEN_GRID = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mlp_csv", type=Path, help="a Vidur mlp.csv profile")
    parser.add_argument("--model", default="llama-3-8b", help="model preset the profile was taken for")
    parser.add_argument("--hardware", default="a100-80gb", help="hardware preset it was measured on")
    parser.add_argument("--dtype-bytes", type=int, default=2)
    args = parser.parse_args()

    model = load_model_spec(args.model)
    hw = load_hardware_spec(args.hardware)
    layer_weights = model.params_per_layer - 2 * model.hidden_size  # the four matmuls (and any q/k/v bias)
    with args.mlp_csv.open() as f:
        rows = {(int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])): r for r in csv.DictReader(f)}
    tps = sorted({tp for _, tp in rows})

    print(f"{args.model} on {args.hardware}: one layer, median of Vidur's measurements, times in ms")
    print("| tokens | tp | measured matmuls | roofline | measured / roofline | other ops (not in roofline) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for tp in tps:
        for tokens in TOKEN_GRID:
            row = rows.get((tokens, tp))
            if row is None:
                continue
            measured_ms = sum(float(row[f"time_stats.{op}.median"]) for op in MATMULS)
            other_ms = sum(float(row[f"time_stats.{op}.median"]) for op in OTHER_OPS)
            compute_s = 2 * layer_weights * tokens / (hw.peak_flops_per_s * tp)
            memory_s = layer_weights * args.dtype_bytes / (hw.mem_bandwidth_bytes_per_s * tp)
            roofline_ms = max(compute_s, memory_s) * 1e3
            print(
                f"| {tokens} | {tp} | {measured_ms:.3f} | {roofline_ms:.3f} | "
                f"{measured_ms / roofline_ms:.2f} | {other_ms:.3f} |"
            )


if __name__ == "__main__":
    main()

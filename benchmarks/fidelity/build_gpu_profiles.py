"""Build the shipped GPU operator tables (``src/stallfree/data/gpu_profiles/<gpu>.json``) from
Vidur's published profiles (microsoft/vidur ``data/profiling``, MIT licence), as copied to
``../shared/vidur-profiling``.

Per GPU (a100, h100, a40) and per model layer shape and tensor-parallel degree: the median time
of one decoder layer's four linear layers (Vidur's ``attn_pre_proj``, ``attn_post_proj``,
``mlp_up_proj``, ``mlp_down_proj``), of its other measured operators (two RMSNorms, RoPE, the
activation, the residual add) and of the embedding (once a step), by tokens per step, on a
log-spaced subset of Vidur's token grid, made non-decreasing in tokens (a running maximum). Per GPU: the median all-reduce time by buffer size
(bytes) and number of GPUs (``<gpu>_pairwise_nvlink`` for 2 and 4 GPUs, ``<gpu>_dgx`` for 8).
Attention is not in Vidur's public copies and is not here. Times in ms, 4 significant digits.

    .venv/bin/python benchmarks/fidelity/build_gpu_profiles.py ../shared/vidur-profiling
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

GPUS = ("a100", "h100", "a40")
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OTHER_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024)
TOKENS += (1280, 1536, 2048, 2560, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
ALL_REDUCE_POINTS = 28  # log-spaced buffer sizes kept per GPU count
OUT = Path(__file__).resolve().parents[2] / "src" / "stallfree" / "data" / "gpu_profiles"


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _monotone(times: list[float]) -> list[float]:
    """More tokens never take less time: each point is raised to the largest before it (medians
    of neighbouring token counts differ by noise, e.g. 1.133 ms at 48 tokens, 1.127 at 64)."""
    out: list[float] = []
    for t in times:
        out.append(max(t, out[-1]) if out else t)
    return out


def _shape_tables(gpu_dir: Path) -> list[dict[str, object]]:
    shapes = []
    for mlp in sorted(gpu_dir.glob("*/*/mlp.csv")):
        with mlp.open() as f:
            rows = list(csv.DictReader(f))
        first = rows[0]
        by_tp: dict[int, dict[int, dict[str, str]]] = defaultdict(dict)
        for r in rows:
            by_tp[int(r["num_tensor_parallel_workers"])][int(r["num_tokens"])] = r
        tps = {}
        for tp, by_tokens in sorted(by_tp.items()):
            tokens = [t for t in TOKENS if t in by_tokens]

            def med(ops: tuple[str, ...], tokens: list[int] = tokens, rows=by_tokens) -> list[float]:
                # a missing or empty column (phi-2 has no post-attention norm) counts as 0
                return [
                    _round(sum(float(rows[t].get(f"time_stats.{op}.median") or 0) for op in ops))
                    for t in tokens
                ]

            tps[str(tp)] = {
                "tokens": tokens,
                "linear_ms": _monotone(med(LINEAR_OPS)),
                "other_ms": _monotone(med(OTHER_OPS)),
                "embedding_ms": _monotone(med(("emb",))),
            }
        shapes.append(
            {
                "model": mlp.parent.name,
                "hidden_size": int(first["n_embd"]),
                "intermediate_size": int(first["n_expanded_embd"]),
                "num_attention_heads": int(first["n_head"]),
                "num_kv_heads": int(first["n_kv_head"]),
                "vocab_size": int(first["vocab_size"]),
                "gated_mlp": first["use_gated_mlp"] == "True",
                "tp": tps,
            }
        )
    return shapes


def _all_reduce(network: Path, gpu: str) -> dict[str, dict[str, list[float]]]:
    sources = [
        (network / f"{gpu}_pairwise_nvlink" / "all_reduce.csv", (2, 4)),
        (network / f"{gpu}_dgx" / "all_reduce.csv", (8,)),
    ]
    table: dict[str, dict[str, list[float]]] = {}
    for path, workers in sources:
        if not path.exists():
            continue
        with path.open() as f:
            rows = list(csv.DictReader(f))
        for n in workers:
            points = sorted(
                (int(r["size"]), float(r["time_stats.all_reduce.median"]))
                for r in rows
                if int(r["num_workers"]) == n and int(r["devices_per_node"]) == n
            )
            if not points:
                continue
            lo, hi = math.log(points[0][0]), math.log(points[-1][0])
            wanted = [
                math.exp(lo + (hi - lo) * i / (ALL_REDUCE_POINTS - 1)) for i in range(ALL_REDUCE_POINTS)
            ]
            keep = sorted(
                {min(range(len(points)), key=lambda j, w=w: abs(math.log(points[j][0] / w))) for w in wanted}
            )
            # the median over sizes is noisy at small buffers: keep the running minimum of
            # larger sizes' times so the table is monotone in bytes
            sizes = [points[j][0] for j in keep]
            times = [points[j][1] for j in keep]
            for i in range(len(times) - 2, -1, -1):
                times[i] = min(times[i], times[i + 1])
            table[str(n)] = {"bytes": [float(s) for s in sizes], "ms": [_round(t) for t in times]}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("vidur_profiling", type=Path, help="Vidur's data/profiling folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu in GPUS:
        data = {
            "gpu": gpu,
            "source": "microsoft/vidur data/profiling (compute/<gpu>/*/mlp.csv, network/<gpu>_*/all_reduce.csv), "
            "medians; built by benchmarks/fidelity/build_gpu_profiles.py",
            "licence": "MIT, Copyright (c) Microsoft Corporation (see LICENSE-vidur)",
            "units": "ms; per decoder layer for linear_ms / other_ms, per step for embedding_ms; all_reduce by bytes",
            "shapes": _shape_tables(args.vidur_profiling / "compute" / gpu),
            "all_reduce": _all_reduce(args.vidur_profiling / "network", gpu),
        }
        path = args.out / f"{gpu}.json"
        path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{path}: {path.stat().st_size / 1024:.1f} KB, {len(data['shapes'])} shapes")
    shutil.copyfile(args.vidur_profiling / "LICENSE", args.out / "LICENSE-vidur")
    (args.out / "NOTICE").write_text(
        "The tables in this folder are derived from the GPU operator profiles published by the Vidur\n"
        "simulator (https://github.com/microsoft/vidur, data/profiling), Copyright (c) Microsoft\n"
        "Corporation, under the MIT License (LICENSE-vidur). They keep medians only, on a subset of\n"
        "Vidur's token and buffer-size grids; built by benchmarks/fidelity/build_gpu_profiles.py.\n"
    )


if __name__ == "__main__":
    main()

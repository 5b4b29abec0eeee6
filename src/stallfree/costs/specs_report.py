"""The figures ``stallfree specs`` prints: a model's and a hardware preset's, their pair's step
times and KV capacity under a cost model, and the text tables of them."""

from __future__ import annotations

from typing import Any

from stallfree.costs.protocol import StepPricer
from stallfree.specs import HardwareSpec, ModelSpec
from stallfree.specs.model import QUANTIZED_BYTES

DECODE_STREAMS = (1, 16, 64)
MEM_UTILIZATION = 0.9


def model_figures(model: ModelSpec, dtype_bytes: int) -> dict[str, Any]:
    return {
        "name": model.name,
        "architecture": model.architecture,
        "num_params": model.num_params,
        "num_non_embedding_params": model.num_non_embedding_params,
        "num_active_params": model.num_active_params,
        "moe_num_experts": model.moe_num_experts,
        "moe_experts_per_token": model.moe_experts_per_token,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "intermediate_size": model.intermediate_size,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_position_embeddings,
        "weight_bytes": model.weight_bytes(dtype_bytes),
        "kv_bytes_per_token": model.kv_bytes_per_token(dtype_bytes),
        "layout": layout_notes(model),
    }


def layout_notes(model: ModelSpec) -> list[str]:
    """What sets this model apart from a plain dense decoder, one line each."""
    notes = []
    if model.moe_shared_intermediate_size or model.moe_dense_layers:
        notes.append(
            f"experts: {model.num_moe_layers} MoE layers, {model.moe_dense_layers} dense; shared experts "
            f"{model.moe_shared_intermediate_size} wide (every token takes them)"
        )
    if model.is_mla:
        notes.append(
            f"attention: MLA, a {model.kv_lora_rank}-value latent + a {model.qk_rope_head_dim}-value "
            "rotary key cached a token and layer"
        )
    if model.num_sliding_layers:
        notes.append(
            f"sliding window: {model.num_sliding_layers} of {model.num_layers} layers attend to the last "
            f"{model.sliding_window} tokens (priced so; their KV is counted at full length, so the KV "
            "capacity here is a lower bound)"
        )
    if model.quantization in QUANTIZED_BYTES:
        experts, rest = model.decoder_bytes_per_param(2)
        what = (
            f"its decoder weights at {rest:g} bytes"
            if experts == rest
            else f"its experts at {experts:g} bytes"
        )
        notes.append(f"checkpoint: {model.quantization}, {what} a parameter (as servers load it)")
    elif model.quantization:
        notes.append(f"checkpoint: {model.quantization}, not modelled: its weights are sized at the dtype")
    return notes


def hardware_figures(hw: HardwareSpec) -> dict[str, Any]:
    return {
        "name": hw.name,
        "peak_flops_per_s": hw.peak_flops_per_s,
        "mem_bandwidth_bytes_per_s": hw.mem_bandwidth_bytes_per_s,
        "mem_capacity_bytes": hw.mem_capacity_bytes,
        "interconnect_bandwidth_bytes_per_s": hw.interconnect_bandwidth_bytes_per_s,
        "interconnect_latency_s": hw.interconnect_latency_s,
    }


def step_figures(
    costs: StepPricer,
    kind: str,
    tp: int,
    kv_capacity_tokens: int,
    context_tokens: int,
    prompt_tokens: int,
) -> dict[str, Any]:
    prefill_s = costs.prefill_time_s(prompt_tokens)
    return {
        "tp": tp,
        "cost_model": kind,
        "mem_utilization": MEM_UTILIZATION,
        "kv_capacity_tokens": kv_capacity_tokens,
        "context_tokens": context_tokens,
        "decode_step_s": {str(n): costs.decode_step_s(n, context_tokens) for n in DECODE_STREAMS},
        "prompt_tokens": prompt_tokens,
        "prefill_s": prefill_s,
        "prefill_tokens_per_s": prompt_tokens / prefill_s,
        "ridge_tokens": costs.ridge_tokens(),
    }


def kv_capacity_tokens(model: ModelSpec, hw: HardwareSpec, tp: int, dtype_bytes: int) -> int:
    """KV tokens one replica holds, as ``simulate`` sizes it by default (0: the weights do not fit)."""
    from stallfree.core import DEFAULT_TOKEN_BUDGET
    from stallfree.costs.memory import kv_memory

    try:
        kv = kv_memory(
            model,
            hw,
            tp=tp,
            gpu_memory_utilization=MEM_UTILIZATION,
            dtype_bytes=dtype_bytes,
            max_num_batched_tokens=DEFAULT_TOKEN_BUDGET,
        )
    except ValueError:
        return 0
    return kv.num_tokens


def presets_table(models: list[ModelSpec], hardware: list[HardwareSpec]) -> str:
    lines = [
        "Model presets (bf16):",
        f"  {'name':<16}{'architecture':<20}{'params':>9}{'layers':>8}{'hidden':>8}{'heads/kv':>10}{'context':>9}{'KV/token':>11}",
    ]
    for m in models:
        lines.append(
            f"  {m.name:<16}{m.architecture:<20}{m.num_params / 1e9:>8.2f}B{m.num_layers:>8}{m.hidden_size:>8}"
            f"{f'{m.num_attention_heads}/{m.num_kv_heads}':>10}{m.max_position_embeddings:>9}"
            f"{_kib(m.kv_bytes_per_token(2)):>11}"
        )
    lines += [
        "",
        "Hardware presets (per GPU, dense bf16):",
        f"  {'name':<12}{'TFLOP/s':>9}{'TB/s':>7}{'memory':>10}{'link GB/s':>11}",
    ]
    for h in hardware:
        lines.append(
            f"  {h.name:<12}{h.peak_flops_per_s / 1e12:>9.0f}{h.mem_bandwidth_bytes_per_s / 1e12:>7.3f}"
            f"{h.mem_capacity_bytes / 2**30:>7.0f}GiB{h.interconnect_bandwidth_bytes_per_s / 1e9:>11.0f}"
        )
    lines += ["", "Details: stallfree specs --model NAME --hardware NAME [--tp N]"]
    return "\n".join(lines)


def report_text(report: dict[str, Any]) -> str:
    lines = []
    model, hw, roof = report.get("model"), report.get("hardware"), report.get("roofline")
    if model is not None:
        lines += [
            f"model       {model['name']} ({model['architecture']})",
            f"  params               {model['num_params'] / 1e9:.2f} B"
            f" ({model['num_non_embedding_params'] / 1e9:.2f} B non-embedding)"
            + (
                f"; {model['num_active_params'] / 1e9:.2f} B active: {model['moe_experts_per_token']} of"
                f" {model['moe_num_experts']} experts a token"
                if model["moe_num_experts"] > 1
                else ""
            ),
            f"  layers x hidden      {model['num_layers']} x {model['hidden_size']},"
            f" {model['num_attention_heads']} heads / {model['num_kv_heads']} KV heads of {model['head_dim']}",
            f"  {'weights (' + report['dtype'] + ')':<21}{model['weight_bytes'] / 1e9:.1f} GB",
            f"  KV cache per token   {_kib(model['kv_bytes_per_token'])}",
            *(f"  {note}" for note in model["layout"]),
        ]
    if hw is not None:
        lines += [
            f"hardware    {hw['name']}",
            f"  peak compute         {hw['peak_flops_per_s'] / 1e12:.0f} TFLOP/s",
            f"  memory               {hw['mem_capacity_bytes'] / 1e9:.1f} GB"
            f" ({hw['mem_capacity_bytes'] / 2**30:.0f} GiB) at"
            f" {hw['mem_bandwidth_bytes_per_s'] / 1e12:.3f} TB/s",
            f"  interconnect         {hw['interconnect_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s per direction",
        ]
    if roof is not None:
        split = ", experts split whole over the GPUs (EP)" if roof.get("expert_parallel") else ""
        lines += [f"roofline    tp={roof['tp']}{split}, cost model {roof['cost_model']}", *_step_lines(roof)]
    measured = report.get("measured")
    if measured is not None:
        lines += _measured_lines(measured)
    return "\n".join(lines)


def _step_lines(figures: dict[str, Any]) -> list[str]:
    capacity = figures["kv_capacity_tokens"]
    capacity_text = f"{capacity:,} tokens" if capacity else "none: the weights do not fit"
    lines = [f"  KV capacity          {capacity_text} (at {figures['mem_utilization']:.0%} memory)"]
    context = (
        f", {figures['context_tokens']} cached tokens each" if figures["cost_model"] != "weights-only" else ""
    )
    for streams, step_s in figures["decode_step_s"].items():
        lines.append(f"  decode step x{streams:<4}    {step_s * 1e3:.1f} ms{context}")
    return [
        *lines,
        f"  prefill              {figures['prefill_tokens_per_s']:,.0f} tokens/s"
        f" ({figures['prompt_tokens']:,}-token prompt alone: {figures['prefill_s']:.2f} s)",
        f"  ridge                {figures['ridge_tokens']:.0f} tokens per step"
        + (f" ({figures.get('ridge', 'the roofline')})" if figures["cost_model"] == "measured" else ""),
    ]


def _measured_lines(m: dict[str, Any]) -> list[str]:
    """The GPU measured model: its table, what is measured and what modelled, achieved figures."""
    if "ops" in m:  # aiconfigurator-core's tables: every op measured
        return [
            f"measured    tp={m['tp']}, {m['source']} ({m['model_id']})",
            f"  ops                  {', '.join(m['ops'])}",
            f"  fixed per step       {m['overhead_s'] * 1e3:g} ms (GPU kernels only: CPU scheduling left out)",
            *_step_lines(m),
            "  by tokens per step   one prompt chunk of that many tokens, no earlier context:",
            *(f"  {int(n):>11,}{e['step_s'] * 1e3:>10.2f} ms" for n, e in m["by_tokens_per_step"].items()),
        ]
    lines = [
        f"measured    tp={m['tp']}, {m['source']}",
        f"  decoder layers       {m['linear_layers']}",
        f"  embedding            measured: the {m['table_model']} table's, once a step",
        f"  all-reduce           {m['all_reduce']}",
        f"  attention            {m['attention']}",
        f"  LM head              {m['lm_head']}",
        f"  fixed per step       {m['overhead_s'] * 1e3:g} ms (CPU scheduling and sampling left out, as Vidur)",
        *_step_lines(m),
        "  by tokens per step   one prompt chunk of that many tokens, no earlier context:",
        f"  {'tokens':>11}{'decoder layer':>16}{'step':>11}{'achieved (linear FLOPs)':>27}{'table efficiency':>19}",
    ]
    for tokens, entry in m["by_tokens_per_step"].items():
        achieved = f"{entry['flops_per_s'] / 1e12:.1f} TFLOP/s a GPU"
        lines.append(
            f"  {int(tokens):>11,}{entry['layer_s'] * 1e3:>13.3f} ms{entry['step_s'] * 1e3:>8.2f} ms"
            f"{achieved:>27}{entry['table_efficiency']:>19.0%}"
        )
    lines.append("  (table efficiency: the roofline's time / the measured time of the table's linear layers)")
    return lines


def _kib(num_bytes: int) -> str:
    return f"{num_bytes / 1024:g} KiB"

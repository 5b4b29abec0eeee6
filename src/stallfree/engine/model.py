"""The Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2) over a ragged, paged batch.

One class, :class:`LlamaModel`, built from a :class:`~stallfree.specs.ModelSpec`. Its
forward takes every token of every scheduled chunk flattened into one tensor, so each
linear layer is ONE matmul over the whole step; attention is delegated to
:func:`stallfree.engine.attention.paged_attention`, which reads each sequence's own KV
context from the paged cache. Logits are computed only for the rows that sample.

Parameters use our own names (q/k/v and gate/up fused, so a step runs one matmul for
each pair); :mod:`stallfree.engine.weights` maps them to and from Hugging Face's names.
Invariants: parameters are created uninitialised (a loader or
:func:`init_random_weights` fills them), all in one dtype; RoPE angles are always
computed in fp32, as Hugging Face does, then applied in the model dtype.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from stallfree.engine.attention import AttentionMetadata, NativeDecode, paged_attention
from stallfree.engine.dtypes import prepacks
from stallfree.engine.kv_cache import KVCache
from stallfree.engine.native import (
    DecodeLayers,
    FusedOps,
    PanelLinear,
    Q8PanelLinear,
    decode_layers_kernel,
    fused_ops_for,
    linear_kernel_for,
    native_module,
    pack_panels,
    pack_q8_panels,
    panel_linear_kernel,
    q8_panel_linear_kernel,
)
from stallfree.specs import ModelSpec
from stallfree.specs.model import ENGINE_ARCHITECTURES


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse frequencies (fp32, ``head_dim / 2``) with the config's RoPE scaling applied."""
    # fp32 throughout, exactly as the reference computes it, so angles match bit for bit.
    exponents = torch.arange(0, spec.head_dim, 2, dtype=torch.int64).float() / spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta**exponents)
    scaling = spec.rope_scaling_dict()
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return inv_freq
    assert scaling is not None
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return scaled
    raise ValueError(f"model {spec.name}: rope scaling type {rope_type!r} is not supported")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ([T, H, D]) by per-token angles; HF's half-split (not interleaved) layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 like the reference implementation, then scale in the model dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


QUANTIZATIONS = ("q8_0", "bf16")
"""Weight formats the engine runs with fp32 activations (``prepack_cpu_weights``): q8_0,
llama.cpp's int8 blocks; bf16, the weights rounded to bf16."""


def _param(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class PackedWeights:
    """Matmul weights packed once at load on CPU, and the one ``linear`` every matmul goes through.

    ``kind`` says how (:mod:`stallfree.engine.native` has the compiled kernels):

    - "panels": fp32 in panels of 16 output features for the compiled ``panel_linear``, which on
      an AVX2-only EPYC (one thread) ran random:medium's decode steps in 0.77-0.84x the time of
      oneDNN's and a 2K prefill in 0.91-1.00x (``benchmarks/engine/linear_kernel_ab.py``);
    - "q8_0": int8 in blocks of 32 inputs with one scale each (llama.cpp's Q8_0) for
      ``q8_panel_linear``, fp32 activations: a quarter of fp32's bytes to read per decode step;
    - "bf16": bf16 panels (each feature's inputs in pairs) for ``panel_linear``, fp32
      activations: half fp32's bytes; prefill rows in AVX512-BF16's pair dot products where the
      CPU has them;
    - "onednn": oneDNN's blocked layout (bf16, or where the kernels cannot build): it otherwise
      re-lays out a bf16 weight on every call; pre-packed once, small-batch (decode) matmuls run
      1.5-2.7x faster, large ones ~1.2x, with bit-identical results in bf16;
    - "": nothing packed; every matmul goes through ``F.linear``.
    """

    def __init__(self) -> None:
        # id(weight) -> (its packed copy, its scales for q8_0 (else None), its output features)
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor | None, int]] = {}
        self._panel_linear: PanelLinear | None = None
        self._q8_linear: Q8PanelLinear | None = None
        self.kind = ""

    def __bool__(self) -> bool:
        return bool(self._packed)

    def pack(self, weights: list[torch.Tensor], keep: torch.Tensor, kind: str) -> None:
        """Pack ``weights`` as ``kind``; every original but ``keep`` is then freed (its packed
        copy replaces it)."""
        self.kind = kind
        self._panel_linear = panel_linear_kernel(kind == "bf16") if kind in ("panels", "bf16") else None
        self._q8_linear = q8_panel_linear_kernel() if kind == "q8_0" else None
        for weight in weights:
            scales = None
            if kind in ("panels", "bf16"):
                packed = pack_panels(weight, torch.bfloat16 if kind == "bf16" else torch.float32)
            elif kind == "q8_0":
                packed, scales = pack_q8_panels(weight)
            else:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)
            self._packed[id(weight)] = (packed, scales, weight.shape[0])
            if weight is not keep:
                weight.data = torch.empty(0, dtype=weight.dtype)

    def packed(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``weight``'s packed copy and its Q8_0 scales (None for fp32 or bf16 panels)."""
        packed, scales, _ = self._packed[id(weight)]
        return packed, scales

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        entry = self._packed.get(id(weight))
        if entry is None:
            return F.linear(x, weight, bias)
        packed, scales, out_features = entry
        if scales is not None:
            assert self._q8_linear is not None
            return self._q8_linear(x.contiguous(), packed, scales, bias, out_features)
        if self._panel_linear is not None:
            return self._panel_linear(x.contiguous(), packed, bias, out_features)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        return out


class DecoderLayer(nn.Module):
    """One pre-norm block: ``h += attention(norm(h))``, then ``h += mlp(norm(h))``."""

    def __init__(
        self,
        spec: ModelSpec,
        dtype: torch.dtype,
        device: torch.device | str | None,
        weights: PackedWeights,
    ) -> None:
        super().__init__()
        h, q, kv = spec.hidden_size, spec.q_size, spec.kv_size
        self.spec = spec
        self.fused: FusedOps | None = None  # the compiled small ops (fp32 CPU), set with the packing
        self.weights = weights  # shared with the model: how this layer's matmuls run
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        self.input_layernorm = _param(h, dtype=dtype, device=device)
        self.qkv_proj = _param(q + 2 * kv, h, dtype=dtype, device=device)
        self.qkv_bias = _param(q + 2 * kv, dtype=dtype, device=device) if spec.attention_bias else None
        self.o_proj = _param(h, q, dtype=dtype, device=device)
        self.post_attention_layernorm = _param(h, dtype=dtype, device=device)
        self.gate_up_proj = _param(2 * spec.intermediate_size, h, dtype=dtype, device=device)
        self.down_proj = _param(h, spec.intermediate_size, dtype=dtype, device=device)

    def matmul_weights(self) -> list[torch.Tensor]:
        return [self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj]

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        """``hidden`` ([T, hidden_size]) after this layer; writes the step's K/V into ``cache``."""
        hidden = hidden + self.attention(self.norm(hidden, self.input_layernorm), cos, sin, cache, attn)
        return hidden + self.mlp(self.norm(hidden, self.post_attention_layernorm))

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused.rms_norm(x, weight, self.spec.rms_norm_eps)
        return rms_norm(x, weight, self.spec.rms_norm_eps)

    def attention(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        spec, linear = self.spec, self.weights.linear
        num_tokens, head_dim = x.shape[0], spec.head_dim
        qkv = linear(x, self.qkv_proj, self.qkv_bias)
        if self.fused is not None:  # q and k rotated in place
            self.fused.rope_(
                qkv,
                cos.view(num_tokens, -1),
                sin.view(num_tokens, -1),
                spec.num_attention_heads,
                spec.num_kv_heads,
            )
        q, k, v = torch.split(qkv, [spec.q_size, spec.kv_size, spec.kv_size], dim=-1)
        q, k, v = (t.view(num_tokens, -1, head_dim) for t in (q, k, v))
        if self.fused is None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return linear(paged_attention(q, k, v, cache, attn, self.scale), self.o_proj)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.weights.linear(x, self.gate_up_proj)
        if self.fused is not None:
            return self.weights.linear(self.fused.silu_mul(gate_up), self.down_proj)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.weights.linear(F.silu(gate) * up, self.down_proj)


class NativeDecoder:
    """Every layer of an all-decode step in one compiled call (``csrc/decoder.cpp``): the same
    kernels in the same order as :class:`DecoderLayer` with the compiled ops, so the same numbers,
    without ~25 Python-dispatched ops a layer. Built by ``prepack_cpu_weights`` for fp32 panels or
    Q8_0 or bf16 weights, when the compiled decode attention and small ops run too."""

    def __init__(self, kernel: DecodeLayers, model: LlamaModel) -> None:
        self.kernel = kernel
        self.spec = model.spec
        self.weights: list[torch.Tensor] = []
        self.scales: list[torch.Tensor] = []
        layers = model.decoder_layers()
        for layer in layers:
            qkv, o, gate_up, down = (model.weights.packed(w) for w in layer.matmul_weights())
            self.weights += [
                layer.input_layernorm,
                qkv[0],
                o[0],
                layer.post_attention_layernorm,
                gate_up[0],
                down[0],
            ]
            self.scales += [s for _, s in (qkv, o, gate_up, down) if s is not None]
        self.qkv_biases = [layer.qkv_bias for layer in layers if layer.qkv_bias is not None]

    def __call__(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        slots: torch.Tensor,
        decode: NativeDecode,
    ) -> torch.Tensor:
        spec = self.spec
        return self.kernel(
            hidden,
            cos,
            sin,
            self.weights,
            self.scales,
            self.qkv_biases,
            kv_cache.key,
            kv_cache.value,
            slots,
            decode.block_table,
            decode.context_lens,
            spec.num_attention_heads,
            spec.intermediate_size,
            spec.rms_norm_eps,
            1.0 / math.sqrt(spec.head_dim),
        )


class LlamaModel(nn.Module):
    """Weights + forward of one decoder; no sampling, no scheduling, no cache ownership."""

    def __init__(
        self, spec: ModelSpec, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        if spec.architecture not in ENGINE_ARCHITECTURES:
            raise ValueError(
                f"the engine runs {', '.join(ENGINE_ARCHITECTURES)} models; {spec.name} is a "
                f"{spec.architecture}, which the simulator prices but the engine does not run"
            )
        if spec.num_sliding_layers:
            raise ValueError(
                f"{spec.name} attends over a sliding window of {spec.sliding_window} tokens, which the "
                "simulator prices but the engine does not run"
            )
        super().__init__()
        self.spec = spec
        self.dtype = dtype
        self.weights = PackedWeights()
        self.embed_tokens = _param(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, dtype, device, self.weights) for _ in range(spec.num_layers)
        )
        self.norm = _param(spec.hidden_size, dtype=dtype, device=device)
        self.lm_head = (
            None
            if spec.tie_word_embeddings
            else _param(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        )
        self.register_buffer("inv_freq", rope_inv_freq(spec).to(device), persistent=False)
        self.inv_freq: torch.Tensor
        self.native_decoder: NativeDecoder | None = None  # set by prepack_cpu_weights where it runs

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def prepack_cpu_weights(self, quantization: str | None = None) -> bool:
        """On CPU, pack every matmul weight once: panels for the compiled fp32 kernel (or, with
        ``quantization="q8_0"`` / ``"bf16"``, int8 Q8_0 / bf16 panels), else oneDNN's blocked
        layout.

        See :class:`PackedWeights`. Packed copies replace the originals, except the embedding
        (also needed for its row lookup), so the model can run but no longer be saved. In fp32
        the packed kernels sum in another order than torch's plain matmul (logits within 1e-5 of
        the plain ones on the tests' models): the engine serves with them, the reference checks
        against transformers run the plain model. Returns whether anything was packed; a
        quantization that cannot run here is a one-line ValueError.
        """
        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(
                f"unknown quantization {quantization!r}; choose from: {', '.join(QUANTIZATIONS)}"
            )
        if self.weights:
            return False
        if quantization is not None:
            if self.device.type != "cpu" or self.dtype != torch.float32:
                raise ValueError(
                    f"{quantization} weights run on the CPU with fp32 activations (--dtype float32), not "
                    f"{str(self.dtype).removeprefix('torch.')} on {self.device.type}"
                )
            if native_module() is None:
                raise ValueError(
                    f"{quantization} weights need the engine's compiled kernels, which did not build here"
                )
            kind = quantization
        elif linear_kernel_for(self.device, self.dtype) is not None:
            kind = "panels"
        elif (
            self.device.type == "cpu"
            and self.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and prepacks(self.dtype)
        ):
            kind = "onednn"
        else:
            # torch refuses to pack bf16 without AVX-512 (or AVX-NE-CONVERT), fp16 without
            # AVX512-FP16: those CPUs run the same weights unpacked, through F.linear.
            return False
        weights = [self.lm_head_weight()]
        for layer in self.decoder_layers():
            weights += layer.matmul_weights()
        self.weights.pack(weights, keep=self.embed_tokens, kind=kind)
        fused = fused_ops_for(self.device, self.dtype)
        for layer in self.decoder_layers():
            layer.fused = fused
        decoder = decode_layers_kernel() if kind != "onednn" and fused is not None else None
        self.native_decoder = None if decoder is None else NativeDecoder(decoder, self)
        return True

    @property
    def is_prepacked(self) -> bool:
        return bool(self.weights)

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens if self.lm_head is None else self.lm_head

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        attn: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (fp32, ``[len(logits_indices), vocab]``) for the rows that sample.

        ``input_ids`` and ``positions`` are ``[T]``: all tokens of the step, chunk after
        chunk in the order ``attn`` describes. K/V of every token are written to the
        cache at ``attn.slot_mapping`` before attention reads them.
        """
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        cos = angles.cos().to(self.dtype)[:, None, :]
        sin = angles.sin().to(self.dtype)[:, None, :]
        hidden = F.embedding(input_ids, self.embed_tokens)
        decode = attn.native_decode
        if self.native_decoder is not None and decode is not None and not attn.chunks:
            num_tokens = input_ids.shape[0]  # all decodes, attended by the compiled kernel
            hidden = self.native_decoder(
                hidden,
                cos.view(num_tokens, -1),
                sin.view(num_tokens, -1),
                kv_cache,
                attn.slot_mapping,
                decode,
            )
        else:
            for index, layer in enumerate(self.decoder_layers()):
                hidden = layer(hidden, cos, sin, kv_cache.layer(index), attn)
        last = rms_norm(hidden[logits_indices], self.norm, self.spec.rms_norm_eps)
        return self.weights.linear(last, self.lm_head_weight()).float()


def init_random_weights(model: LlamaModel, seed: int) -> None:
    """Seeded random weights: normal(0, 1/sqrt(fan_in)) matrices, unit norm weights.

    The std keeps activations O(1) through the layers, so random models give peaked,
    seed-determined logits (greedy decoding is well defined, not a coin toss of near ties).
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if param.dim() == 1:
            if name.endswith("bias"):
                values = torch.randn(param.shape, generator=generator) * 0.02
            else:
                values = torch.ones(param.shape)
        else:
            values = torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[1])
        param.data.copy_(values.to(param.dtype))

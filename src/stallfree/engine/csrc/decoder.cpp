// Every decoder layer of a step whose tokens are all decodes, in one call: at one stream the
// layers' matmuls take ~19 of SmolLM2's ~26 ms fp32 step and the rest is Python and eager-op
// overhead of a few microseconds per op, ~25 ops a layer; here a layer is ten calls of the
// kernels above, no Python between them. The same kernels, in the same order, as the Python
// layer (model.py's DecoderLayer with the compiled ops): the same numbers, bit for bit.
//
// hidden:          [n, H] fp32, the embeddings; updated in place and returned
// cos, sin:        [n, D / 2]
// weights:         per layer: input norm [H], qkv, o, post-attention norm [H], gate_up, down
//                  (the matmuls packed: fp32 or bf16 panels, or int8 Q8_0 panels with scales)
// scales:          per layer: the scales of qkv, o, gate_up, down (Q8_0); empty for fp32 panels
// qkv_biases:      one per layer (Qwen2), or empty
// key/value_cache: [layers, kv_heads, num_blocks, block_size, D]
// slots:           [n] int64, the cache slot each row's K/V is written to
// block_table, context_lens: as decode_attention's (context lengths include this row)
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLayerWeights = 6, kLayerScales = 4;

torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& panels, const torch::Tensor* scales,
                            const std::optional<torch::Tensor>& bias, int64_t out_features) {
  if (scales != nullptr) return q8_panel_linear(x, panels, *scales, bias, out_features);
  return panel_linear(x, panels, bias, out_features);
}

void add_into(torch::Tensor& hidden, const torch::Tensor& x) {
  float* h = hidden.data_ptr<float>();
  const float* p = x.data_ptr<float>();
  for (int64_t i = 0, size = hidden.numel(); i < size; ++i) h[i] += p[i];
}

// Row r's k and v heads (after q in qkv) to slot slots[r] of this layer's [kv_heads, slots, D] cache.
void write_kv(const torch::Tensor& qkv, float* key, float* value, const int64_t* slots, int64_t q_size,
              int64_t kv_heads, int64_t dim, int64_t cache_slots) {
  const int64_t rows = qkv.size(0), width = qkv.size(1), kv_size = kv_heads * dim;
  const float* p = qkv.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t slot = slots[r];
    TORCH_CHECK(slot >= 0 && slot < cache_slots, "decode_layers: slot out of range");
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* k = p + r * width + q_size + h * dim;
      std::memcpy(key + (h * cache_slots + slot) * dim, k, dim * sizeof(float));
      std::memcpy(value + (h * cache_slots + slot) * dim, k + kv_size, dim * sizeof(float));
    }
  }
}

}  // namespace

torch::Tensor decode_layers(torch::Tensor hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                            const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& scales,
                            const std::vector<torch::Tensor>& qkv_biases, const torch::Tensor& key_cache,
                            const torch::Tensor& value_cache, const torch::Tensor& slots,
                            const torch::Tensor& block_table, const torch::Tensor& context_lens, int64_t q_heads,
                            int64_t intermediate, double eps, double scale) {
  TORCH_CHECK(hidden.dtype() == torch::kFloat32 && hidden.dim() == 2 && hidden.is_contiguous(),
              "decode_layers: hidden must be fp32 [n, H], contiguous");
  TORCH_CHECK(key_cache.dim() == 5 && key_cache.is_contiguous() && value_cache.is_contiguous() &&
                  key_cache.sizes() == value_cache.sizes() && key_cache.dtype() == torch::kFloat32 &&
                  value_cache.dtype() == torch::kFloat32,
              "decode_layers: fp32 caches [layers, kv_heads, blocks, block_size, D], contiguous");
  const int64_t num_layers = key_cache.size(0), kv_heads = key_cache.size(1), dim = key_cache.size(4);
  const int64_t cache_slots = key_cache.size(2) * key_cache.size(3), n = hidden.size(0);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kLayerWeights * num_layers,
              "decode_layers: ", kLayerWeights, " weights per layer");
  TORCH_CHECK(scales.empty() || static_cast<int64_t>(scales.size()) == kLayerScales * num_layers,
              "decode_layers: no scales, or ", kLayerScales, " per layer");
  TORCH_CHECK(qkv_biases.empty() || static_cast<int64_t>(qkv_biases.size()) == num_layers,
              "decode_layers: no qkv biases, or one per layer");
  TORCH_CHECK(slots.dtype() == torch::kInt64 && slots.is_contiguous() && slots.numel() == n,
              "decode_layers: int64 slots [n]");
  const int64_t q_size = q_heads * dim, qkv_size = q_size + 2 * kv_heads * dim, hidden_size = hidden.size(1);
  const int64_t* slot_ids = slots.data_ptr<int64_t>();
  for (int64_t l = 0; l < num_layers; ++l) {
    const torch::Tensor* w = weights.data() + l * kLayerWeights;
    const torch::Tensor* s = scales.empty() ? nullptr : scales.data() + l * kLayerScales;
    std::optional<torch::Tensor> bias;
    if (!qkv_biases.empty()) bias = qkv_biases[l];
    const torch::Tensor key = key_cache[l], value = value_cache[l];

    auto qkv = packed_linear(rms_norm(hidden, w[0], eps), w[1], s, bias, qkv_size);
    rope_(qkv, cos, sin, q_heads, kv_heads);
    write_kv(qkv, key.data_ptr<float>(), value.data_ptr<float>(), slot_ids, q_size, kv_heads, dim, cache_slots);
    auto attended = decode_attention(qkv.narrow(1, 0, q_size).contiguous(), key, value, block_table,
                                     context_lens, scale);
    add_into(hidden, packed_linear(attended, w[2], s == nullptr ? nullptr : s + 1, std::nullopt, hidden_size));
    auto gate_up =
        packed_linear(rms_norm(hidden, w[3], eps), w[4], s == nullptr ? nullptr : s + 2, std::nullopt, 2 * intermediate);
    add_into(hidden, packed_linear(silu_mul(gate_up), w[5], s == nullptr ? nullptr : s + 3, std::nullopt, hidden_size));
  }
  return hidden;
}

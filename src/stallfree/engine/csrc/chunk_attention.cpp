// A prompt chunk's attention over the paged KV cache in bf16 pair dot products (AVX512-BF16),
// softmax and sums in fp32: the chunk's n tokens see the `before` earlier tokens of their sequence
// and, causally, each other. The cache is fp32; q, K, V and the probabilities are rounded to bf16
// for the products, as bf16 attention kernels do (vLLM's and llama.cpp's on the CPU).
//
// q:            [n, heads * D] fp32 (the chunk's rows, any row stride: a view of the qkv
//               matmul's output; D a multiple of 16)
// key/value:    [kv_heads, num_blocks, block_size, D] fp32 (the cache, the chunk's own K/V in it)
// blocks:       [ceil((before + n) / block_size)] int64 (the blocks of the context, in order)
// out:          [n, heads * D] fp32, written (any row stride: the step's rows of the chunk)
//
// Per KV head, the context's keys are packed once as panels of 16 keys (pairs along D) and its
// values as panels of 16 features (pairs along the keys): the layout of the bf16 matmul's
// weights, whose kernel (linear.cpp) then computes both products. Query rows (a tile of tokens
// times the KV head's group of query heads) get their scores over every key the tile's last
// token sees, an exact softmax per row (masked past its own position), then P V.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(STALLFREE_BF16_DOT)
namespace {

// A row of D floats as D bf16.
inline void row_to_bf16(const float* row, int64_t dim, uint16_t* out) {
  bf16_rows(row, dim, dim, dim / 2, out, 0, 1);
}

// Keys [0, len) of one KV head as [ceil(len / 16)][D / 2][16] pairs, zero past len; values as
// [D / 16][ceil(len / 2)][16] pairs (each feature's values of keys 2t, 2t + 1), zero past len.
void pack_head(const float* keys, const float* values, const int64_t* blocks, int64_t block_size,
               int64_t dim, int64_t len, uint32_t* key_panels, uint32_t* value_panels) {
  const int64_t pairs = dim / 2, key_pairs = (len + 1) / 2, block_stride = block_size * dim;
  std::vector<uint16_t> k16(dim), v16(2 * dim);
  std::fill(key_panels, key_panels + (len + 15) / 16 * pairs * 16, 0u);
  std::fill(value_panels, value_panels + dim / 16 * key_pairs * 16, 0u);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t at = blocks[t / block_size] * block_stride + t % block_size * dim;
    row_to_bf16(keys + at, dim, k16.data());
    uint32_t* panel = key_panels + t / 16 * pairs * 16 + t % 16;
    for (int64_t k = 0; k < pairs; ++k)
      panel[k * 16] = static_cast<uint32_t>(k16[2 * k]) | static_cast<uint32_t>(k16[2 * k + 1]) << 16;
    row_to_bf16(values + at, dim, v16.data() + t % 2 * dim);
    if (t % 2 == 1 || t == len - 1) {
      if (t % 2 == 0) std::fill(v16.begin() + dim, v16.end(), uint16_t{0});
      for (int64_t d = 0; d < dim; ++d)
        value_panels[(d / 16 * key_pairs + t / 2) * 16 + d % 16] =
            static_cast<uint32_t>(v16[d]) | static_cast<uint32_t>(v16[dim + d]) << 16;
    }
  }
}

// The largest of row[0, len) (a vector reduction: std::max in a loop stays scalar).
__attribute__((target("avx512f"))) float row_max(const float* row, int64_t len) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < len; t += 16) {
    const __mmask16 in = t + 16 <= len ? 0xFFFF : (1u << (len - t)) - 1;
    top = _mm512_mask_max_ps(top, in, top, _mm512_maskz_loadu_ps(in, row + t));
  }
  return _mm512_reduce_max_ps(top);
}

// out[0, 16 num_panels) of `rows` rows = x (bf16 pairs) times the panels from `panels`
// (panel_pairs apart), two panels at a time.
void dot_all_panels(const uint32_t* xb, int64_t pairs, int64_t rows, const uint32_t* panels, int64_t panel_pairs,
                    int64_t num_panels, float* out, int64_t ld_out) {
  for (int64_t p = 0; p < num_panels; p += 2)
    bf16_dot_panels(xb, pairs, panels + p * panel_pairs * 16, panel_pairs, nullptr, out + p * 16, ld_out,
                    std::min<int64_t>(32, (num_panels - p) * 16), 0, rows);
}

}  // namespace

void chunk_attention(const torch::Tensor& q, const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                     const torch::Tensor& blocks, int64_t before, double scale, torch::Tensor& out) {
  TORCH_CHECK(bf16_dot_products(), "chunk_attention: needs AVX512-BF16 (and STALLFREE_NATIVE_BF16_DOT not 0)");
  TORCH_CHECK(q.dtype() == torch::kFloat32 && key_cache.dtype() == torch::kFloat32 &&
                  value_cache.dtype() == torch::kFloat32 && blocks.dtype() == torch::kInt64,
              "chunk_attention: fp32 q and cache, int64 blocks");
  TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1 && out.dtype() == torch::kFloat32 && out.sizes() == q.sizes() &&
                  out.stride(1) == 1,
              "chunk_attention: q and out must be [n, heads x D] fp32, each row contiguous");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && blocks.is_contiguous(),
              "chunk_attention: contiguous cache and blocks only");
  const int64_t n = q.size(0), kv_heads = key_cache.size(0), num_blocks = key_cache.size(1);
  const int64_t block_size = key_cache.size(2), dim = key_cache.size(3), len = before + n;
  TORCH_CHECK(dim % 16 == 0, "chunk_attention: head size ", dim, " is not a multiple of 16");
  TORCH_CHECK(q.size(1) % (kv_heads * dim) == 0, "chunk_attention: q's width is not heads x D");
  TORCH_CHECK(before >= 0 && blocks.numel() * block_size >= len, "chunk_attention: too few blocks for the context");
  const int64_t* block_ids = blocks.data_ptr<int64_t>();
  for (int64_t b = 0; b < blocks.numel(); ++b)
    TORCH_CHECK(block_ids[b] >= 0 && block_ids[b] < num_blocks, "chunk_attention: block id out of range");
  const int64_t group = q.size(1) / (kv_heads * dim), q_stride = q.stride(0), out_stride = out.stride(0);
  const int64_t pairs = dim / 2;
  const int64_t key_panels = (len + 15) / 16, key_pairs = (len + 1) / 2;
  const int64_t head_floats = num_blocks * block_size * dim;
  auto packed_keys = torch::empty({kv_heads, key_panels * pairs * 16}, q.options().dtype(torch::kInt32));
  auto packed_values = torch::empty({kv_heads, dim / 16 * key_pairs * 16}, q.options().dtype(torch::kInt32));
  uint32_t* kp = reinterpret_cast<uint32_t*>(packed_keys.data_ptr<int32_t>());
  uint32_t* vp = reinterpret_cast<uint32_t*>(packed_values.data_ptr<int32_t>());
  const float* kc = key_cache.data_ptr<float>();
  const float* vc = value_cache.data_ptr<float>();
  at::parallel_for(0, kv_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t h = first; h < last; ++h)
      pack_head(kc + h * head_floats, vc + h * head_floats, block_ids, block_size, dim, len,
                kp + h * key_panels * pairs * 16, vp + h * dim / 16 * key_pairs * 16);
  });

  // Tiles of tokens whose rows (tokens x group) keep their scores within ~512 KB.
  const int64_t tile = std::max<int64_t>(1, std::min<int64_t>(64, 131072 / len) / group);
  const int64_t tiles = (n + tile - 1) / tile;
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t first, int64_t last) {
    std::vector<float> qs, scores, acc;
    std::vector<uint16_t> qb, pb;
    std::vector<float> sums;
    for (int64_t job = first; job < last; ++job) {
      const int64_t h = job / tiles, t0 = job % tiles * tile, t1 = std::min(n, t0 + tile);
      const int64_t rows = (t1 - t0) * group, seen = before + t1;  // keys the tile's last token sees
      const int64_t panels = (seen + 15) / 16, ld = panels * 16, seen_pairs = (seen + 1) / 2;
      // the tile's query rows (token-major: row r is token t0 + r / group, query head h group + r % group)
      qs.resize(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = qp + (t0 + r / group) * q_stride + (h * group + r % group) * dim;
        for (int64_t d = 0; d < dim; ++d) qs[r * dim + d] = row[d] * s;
      }
      qb.resize(rows * dim);
      bf16_rows(qs.data(), dim, dim, pairs, qb.data(), 0, rows);
      scores.resize(rows * ld);
      dot_all_panels(reinterpret_cast<const uint32_t*>(qb.data()), pairs, rows, kp + h * key_panels * pairs * 16,
                     pairs, panels, scores.data(), ld);
      // softmax of each row over the keys it sees (zero past them, up to the pairs' end)
      sums.resize(rows);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = scores.data() + r * ld;
        const int64_t sees = before + t0 + r / group + 1;
        const float top = row_max(row, sees);
        float sum = 0.f;
        for (int64_t t = 0; t < sees; ++t) {
          row[t] = exp_nonpositive(row[t] - top);
          sum += row[t];
        }
        std::fill(row + sees, row + 2 * seen_pairs, 0.f);
        sums[r] = sum;
      }
      pb.resize(rows * 2 * seen_pairs);
      bf16_rows(scores.data(), ld, 2 * seen_pairs, seen_pairs, pb.data(), 0, rows);
      acc.resize(rows * dim);
      dot_all_panels(reinterpret_cast<const uint32_t*>(pb.data()), seen_pairs, rows,
                     vp + h * dim / 16 * key_pairs * 16, key_pairs, dim / 16, acc.data(), dim);
      for (int64_t r = 0; r < rows; ++r) {
        float* to = op + (t0 + r / group) * out_stride + (h * group + r % group) * dim;
        const float inv = 1.f / sums[r];
        for (int64_t d = 0; d < dim; ++d) to[d] = acc[r * dim + d] * inv;
      }
    }
  });
}
#else
void chunk_attention(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, int64_t,
                     double, torch::Tensor&) {
  TORCH_CHECK(false, "chunk_attention: built without the AVX512-BF16 kernels (x86-64 and gcc only)");
}
#endif

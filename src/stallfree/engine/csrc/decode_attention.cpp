// Decode attention over the paged KV cache, fp32 on the CPU: each sequence's K/V blocks are read
// where they lie (no gathered copy), each KV head's group of query heads shares every read.
//
// q:             [n, heads * D] (the step's single-token rows)
// key/value:     [kv_heads, num_blocks, block_size, D] (the cache)
// block_table:   [n, width] int64 (a sequence's blocks; entries past its context are not read)
// context_lens:  [n] int64
// returns        [n, heads * D]
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// e^x for x <= 0 (a score minus its row's maximum): 2^(x log2 e) split into a whole power of two
// and a fraction in [-0.5, 0.5], whose 2^f is a degree-6 Taylor polynomial (relative error
// ~2e-7). Written without calls so that the loops around it vectorize.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.4426950408889634f;
  const float whole = std::floor(t + 0.5f);
  const float f = t - whole;
  float p = 1.5403530393381608e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.6181291076284772e-3f;
  p = p * f + 5.5504108664821580e-2f;
  p = p * f + 2.4022650695910071e-1f;
  p = p * f + 6.9314718055994531e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(whole) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return p * power;
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& key_cache,
                               const torch::Tensor& value_cache, const torch::Tensor& block_table,
                               const torch::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && key_cache.dtype() == torch::kFloat32 &&
                  value_cache.dtype() == torch::kFloat32,
              "decode_attention: fp32 only");
  TORCH_CHECK(block_table.dtype() == torch::kInt64 && context_lens.dtype() == torch::kInt64,
              "decode_attention: int64 block table and context lengths");
  TORCH_CHECK(q.is_contiguous() && key_cache.is_contiguous() && value_cache.is_contiguous() &&
                  block_table.is_contiguous() && context_lens.is_contiguous(),
              "decode_attention: contiguous tensors only");
  const int64_t n = q.size(0), kv_heads = key_cache.size(0), num_blocks = key_cache.size(1);
  const int64_t block_size = key_cache.size(2), dim = key_cache.size(3), width = block_table.size(1);
  TORCH_CHECK(q.size(1) % (kv_heads * dim) == 0, "decode_attention: q's width is not heads x D");
  const int64_t group = q.size(1) / (kv_heads * dim);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = key_cache.data_ptr<float>();
  const float* vp = value_cache.data_ptr<float>();
  const int64_t* tables = block_table.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  const int64_t block_stride = block_size * dim, head_stride = num_blocks * block_stride;

  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(group * dim), qs(group * dim);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t seq = job / kv_heads, head = job % kv_heads, len = lens[seq];
      TORCH_CHECK(len > 0 && len <= width * block_size, "decode_attention: context length out of range");
      const int64_t* table = tables + seq * width;
      const float* qrow = qp + (seq * kv_heads + head) * group * dim;
      for (int64_t i = 0; i < group * dim; ++i) qs[i] = qrow[i] * s;
      scores.resize(group * len);
      // scores[g][t] = q_g . k_t
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const int64_t block = table[t0 / block_size];
        TORCH_CHECK(block >= 0 && block < num_blocks, "decode_attention: block id out of range");
        const float* kb = kp + head * head_stride + block * block_stride;
        const int64_t count = std::min(block_size, len - t0);
        for (int64_t i = 0; i < count; ++i) {
          const float* k = kb + i * dim;
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = qs.data() + g * dim;
            float dot = 0.f;
            for (int64_t d = 0; d < dim; ++d) dot += qg[d] * k[d];
            scores[g * len + t0 + i] = dot;
          }
        }
      }
      // softmax over t, in place
      for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * len;
        float top = row[0];
        for (int64_t t = 1; t < len; ++t) top = std::max(top, row[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) {
          row[t] = exp_nonpositive(row[t] - top);
          sum += row[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) row[t] *= inv;
      }
      // out_g = sum_t p[g][t] v_t
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const float* vb = vp + head * head_stride + table[t0 / block_size] * block_stride;
        const int64_t count = std::min(block_size, len - t0);
        for (int64_t i = 0; i < count; ++i) {
          const float* v = vb + i * dim;
          for (int64_t g = 0; g < group; ++g) {
            const float p = scores[g * len + t0 + i];
            float* a = acc.data() + g * dim;
            for (int64_t d = 0; d < dim; ++d) a[d] += p * v[d];
          }
        }
      }
      std::copy(acc.begin(), acc.end(), op + (seq * kv_heads + head) * group * dim);
    }
  });
  return out;
}

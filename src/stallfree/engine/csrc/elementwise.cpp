// The decoder layer's small ops, fp32 on the CPU, one call each instead of torch's several: at one
// stream a layer's norms, RoPE and SiLU are ~30 eager ops of microseconds each, more time than
// their arithmetic.
//
// rms_norm(x [T, H], weight [H], eps) -> weight * x / sqrt(mean(x^2) + eps)
// rope_(qkv [T, (q_heads + 2 kv_heads) * D], cos [T, D / 2], sin [T, D / 2], q_heads, kv_heads)
//   rotates the q and k heads of qkv in place (Hugging Face's half-split layout); v is untouched
// silu_mul(gate_up [T, 2 I]) -> silu(gate) * up, [T, I]
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

namespace {

// Rows per task: one stream's few rows run on the calling thread, a prefill's split.
constexpr int64_t kRowGrain = 16;

void check_rows(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dtype() == torch::kFloat32 && t.dim() == 2 && t.is_contiguous(), what,
              ": fp32 [rows, features], contiguous");
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  const int64_t rows = x.size(0), h = x.size(1);
  TORCH_CHECK(weight.dtype() == torch::kFloat32 && weight.is_contiguous() && weight.numel() == h,
              "rms_norm: weight must be fp32 [", h, "]");
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* row = xp + r * h;
      float sum = 0.0f;
      for (int64_t i = 0; i < h; ++i) sum += row[i] * row[i];
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) op[r * h + i] = wp[i] * (row[i] * inv);
    }
  });
  return out;
}

void rope_(torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, int64_t q_heads,
           int64_t kv_heads) {
  check_rows(qkv, "rope_");
  check_rows(cos, "rope_ cos");
  check_rows(sin, "rope_ sin");
  const int64_t rows = qkv.size(0), half = cos.size(1), dim = 2 * half;
  TORCH_CHECK(cos.size(0) == rows && sin.size(0) == rows && sin.size(1) == half,
              "rope_: cos and sin must be [rows, D / 2]");
  TORCH_CHECK(qkv.size(1) == (q_heads + 2 * kv_heads) * dim, "rope_: qkv is not (q + 2 kv) heads of ", dim);
  float* p = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t width = qkv.size(1), rotated = q_heads + kv_heads;
  at::parallel_for(0, rows, kRowGrain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* c = cp + r * half;
      const float* s = sp + r * half;
      for (int64_t head = 0; head < rotated; ++head) {
        float* x = p + r * width + head * dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c[i] - x2 * s[i];
          x[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  });
}

torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  check_rows(gate_up, "silu_mul");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * inter, "silu_mul: an odd width");
  auto out = torch::empty({rows, inter}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* g = gp + r * 2 * inter;
      const float* u = g + inter;
      // sigmoid(x) from e^-|x| (decode_attention.cpp's exp, which vectorizes; std::exp is a call
      // per element, 0.3 s of a 2,048-token prompt of SmolLM2-135M)
      for (int64_t i = 0; i < inter; ++i) {
        const float x = g[i], e = exp_nonpositive(-std::fabs(x)), inv = 1.0f / (1.0f + e);
        op[r * inter + i] = x * (x >= 0.0f ? inv : e * inv) * u[i];
      }
    }
  });
  return out;
}

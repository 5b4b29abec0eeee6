// y = x W^T (+ bias), fp32 on the CPU, over a weight packed in panels of 16 output features:
// panel p holds features 16p .. 16p+15 as [K][16] (zero rows past N), so a step of the inner loop
// reads 16 consecutive floats of the weight and every one of them is used by each row of x.
//
// x:       [M, K] fp32, rows contiguous
// panels:  [ceil(N / 16), K, 16] fp32 (stallfree.engine.native.pack_panels)
// bias:    [N] fp32 or None
// returns  [M, N]
//
// Threads split the panels (torch's pool, torch.set_num_threads); each panel meets every row of x
// while it is in cache, six rows at a time (12 accumulators of 8 floats: the register file's
// worth on AVX2). One stream's decode reads each weight once, at memory speed; prefill's rows
// share every panel read.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

namespace {

typedef float f32x8 __attribute__((vector_size(32)));

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Rows [0, R) of x against one panel: out[r][0..cols) = x[r] . panel (+ bias).
template <int R>
inline void panel_rows(const float* x, int64_t k_size, const float* panel, const float* bias,
                       float* out, int64_t ld_out, int64_t cols) {
  f32x8 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = f32x8{};
  for (int64_t k = 0; k < k_size; ++k) {
    const f32x8 w_lo = load8(panel + k * 16), w_hi = load8(panel + k * 16 + 8);
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k_size + k];
      lo[r] += s * w_lo;
      hi[r] += s * w_hi;
    }
  }
  for (int r = 0; r < R; ++r) {
    float row[16];
    std::memcpy(row, &lo[r], 32);
    std::memcpy(row + 8, &hi[r], 32);
    if (bias != nullptr)
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    std::memcpy(out + r * ld_out, row, cols * sizeof(float));
  }
}

}  // namespace

torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& panels,
                           const std::optional<torch::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && panels.dtype() == torch::kFloat32,
              "panel_linear: fp32 only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && panels.dim() == 3 && panels.is_contiguous() &&
                  panels.size(2) == 16,
              "panel_linear: x [M, K] and panels [P, K, 16], contiguous");
  const int64_t m_size = x.size(0), k_size = x.size(1), num_panels = panels.size(0);
  TORCH_CHECK(panels.size(1) == k_size, "panel_linear: x has ", k_size, " features, the weight ",
              panels.size(1));
  TORCH_CHECK(out_features > 16 * (num_panels - 1) && out_features <= 16 * num_panels,
              "panel_linear: ", num_panels, " panels cannot hold ", out_features, " features");
  const float* bias_data = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dtype() == torch::kFloat32 && bias->is_contiguous() &&
                    bias->numel() == out_features,
                "panel_linear: bias must be fp32 [N]");
    bias_data = bias->data_ptr<float>();
  }
  auto out = torch::empty({m_size, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, num_panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const float* panel = wp + p * k_size * 16;
      const float* b = bias_data == nullptr ? nullptr : bias_data + p * 16;
      const int64_t cols = std::min<int64_t>(16, out_features - p * 16);
      float* o = op + p * 16;
      int64_t m = 0;
      for (; m + 6 <= m_size; m += 6)
        panel_rows<6>(xp + m * k_size, k_size, panel, b, o + m * out_features, out_features, cols);
      const float* xr = xp + m * k_size;
      float* orow = o + m * out_features;
      switch (m_size - m) {
        case 5: panel_rows<5>(xr, k_size, panel, b, orow, out_features, cols); break;
        case 4: panel_rows<4>(xr, k_size, panel, b, orow, out_features, cols); break;
        case 3: panel_rows<3>(xr, k_size, panel, b, orow, out_features, cols); break;
        case 2: panel_rows<2>(xr, k_size, panel, b, orow, out_features, cols); break;
        case 1: panel_rows<1>(xr, k_size, panel, b, orow, out_features, cols); break;
        default: break;
      }
    }
  });
  return out;
}

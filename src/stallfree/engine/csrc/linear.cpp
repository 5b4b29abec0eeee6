// y = x W^T (+ bias), fp32 activations on the CPU, over a weight packed in panels of 16 output
// features: panel p holds features 16p .. 16p+15 as [K][16] (zero rows past N), so a step of the
// inner loop reads 16 consecutive weights and every one of them is used by each row of x.
//
// panel_linear: fp32 weights, or bf16 ones (half the bytes to read; each widened to fp32, exactly,
//   in registers for a few rows, else each panel once into a per-thread fp32 buffer).
//   x:       [M, K] fp32, rows contiguous
//   panels:  [ceil(N / 16), K, 16] fp32 or bf16 (stallfree.engine.native.pack_panels)
//   bias:    [N] fp32 or None
//   returns  [M, N]
// q8_panel_linear: int8 weights in blocks of 32 inputs with one scale each (llama.cpp's Q8_0);
//   for a few rows each block's weights are widened to fp32 in registers; for more, each panel
//   is widened once into a per-thread fp32 buffer that every row then reads.
//   panels:  [ceil(N / 16), ceil(K / 32), 32, 16] int8 (zero past N and K)
//   scales:  [ceil(N / 16), ceil(K / 32), 16] fp32
//
// Threads split the panels (torch's pool, torch.set_num_threads); each panel meets every row of x
// while it is in cache, six rows at a time (12 accumulators of 8 floats: the register file's
// worth on AVX2). One stream's decode reads each weight once, at memory speed; prefill's rows
// share every panel read.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

typedef float f32x8 __attribute__((vector_size(32)));

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Eight bf16 as eight floats: a bf16 is the top half of an fp32.
inline f32x8 load8(const uint16_t* p) {
#if defined(__AVX2__)
  const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  f32x8 out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
#else
  f32x8 out;
  for (int i = 0; i < 8; ++i) {
    const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof bits);
  }
  return out;
#endif
}

// Eight int8 as eight floats (gcc leaves a generic conversion scalar: AVX2 has it in two ops).
inline f32x8 widen8(const int8_t* p) {
#if defined(__AVX2__)
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  f32x8 out;
  std::memcpy(&out, &v, sizeof out);
  return out;
#else
  f32x8 out;
  for (int i = 0; i < 8; ++i) out[i] = p[i];
  return out;
#endif
}

// out[r][0..cols) = the accumulators of row r (+ bias).
template <int R>
inline void store_rows(const f32x8* lo, const f32x8* hi, const float* bias, float* out, int64_t ld_out,
                       int64_t cols) {
  for (int r = 0; r < R; ++r) {
    float row[16];
    std::memcpy(row, &lo[r], 32);
    std::memcpy(row + 8, &hi[r], 32);
    if (bias != nullptr)
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    std::memcpy(out + r * ld_out, row, cols * sizeof(float));
  }
}

// Rows [0, R) of x against one panel (fp32 or bf16): out[r][0..cols) = x[r] . panel (+ bias).
template <int R, typename W>
inline void panel_rows(const float* x, int64_t k_size, const W* panel, const float* bias,
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
  store_rows<R>(lo, hi, bias, out, ld_out, cols);
}

// The same over a Q8_0 panel, for a few rows: block by block, each row of 16 int8 weights widened
// to fp32 in registers; a block's sums are kept unscaled in two sets (even and odd inputs, so one
// row's additions do not wait on each other) and scaled once at its end.
template <int R>
inline void q8_panel_rows(const float* x, int64_t k_size, const int8_t* panel, const float* scales,
                          const float* bias, float* out, int64_t ld_out, int64_t cols) {
  f32x8 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = f32x8{};
  for (int64_t k0 = 0, b = 0; k0 < k_size; k0 += 32, ++b) {
    const int8_t* block = panel + b * 32 * 16;
    const int64_t kn = std::min<int64_t>(32, k_size - k0);
    f32x8 lo0[R], hi0[R], lo1[R], hi1[R];
    for (int r = 0; r < R; ++r) lo0[r] = hi0[r] = lo1[r] = hi1[r] = f32x8{};
    int64_t k = 0;
    for (; k + 2 <= kn; k += 2) {
      const f32x8 a_lo = widen8(block + k * 16), a_hi = widen8(block + k * 16 + 8);
      const f32x8 b_lo = widen8(block + k * 16 + 16), b_hi = widen8(block + k * 16 + 24);
      for (int r = 0; r < R; ++r) {
        const float va = x[r * k_size + k0 + k], vb = x[r * k_size + k0 + k + 1];
        lo0[r] += va * a_lo;
        hi0[r] += va * a_hi;
        lo1[r] += vb * b_lo;
        hi1[r] += vb * b_hi;
      }
    }
    if (k < kn) {
      const f32x8 a_lo = widen8(block + k * 16), a_hi = widen8(block + k * 16 + 8);
      for (int r = 0; r < R; ++r) {
        const float va = x[r * k_size + k0 + k];
        lo0[r] += va * a_lo;
        hi0[r] += va * a_hi;
      }
    }
    const f32x8 s_lo = load8(scales + b * 16), s_hi = load8(scales + b * 16 + 8);
    for (int r = 0; r < R; ++r) {
      lo[r] += (lo0[r] + lo1[r]) * s_lo;
      hi[r] += (hi0[r] + hi1[r]) * s_hi;
    }
  }
  store_rows<R>(lo, hi, bias, out, ld_out, cols);
}

// A Q8_0 panel as an fp32 one ([blocks * 32][16]).
inline void widen_panel(const int8_t* panel, const float* scales, int64_t num_blocks, float* out) {
  for (int64_t b = 0; b < num_blocks; ++b) {
    const f32x8 s_lo = load8(scales + b * 16), s_hi = load8(scales + b * 16 + 8);
    for (int64_t k = 0; k < 32; ++k) {
      const int64_t at = (b * 32 + k) * 16;
      const f32x8 lo = widen8(panel + at) * s_lo, hi = widen8(panel + at + 8) * s_hi;
      std::memcpy(out + at, &lo, 32);
      std::memcpy(out + at + 8, &hi, 32);
    }
  }
}

// A bf16 panel ([K][16]) as an fp32 one.
inline void widen_panel(const uint16_t* panel, int64_t k_size, float* out) {
  for (int64_t i = 0; i < k_size * 16; i += 8) {
    const f32x8 v = load8(panel + i);
    std::memcpy(out + i, &v, 32);
  }
}

// This thread's widened panel (one for every row count: the lambda that fills it is generic).
std::vector<float>& widened_panel() {
  thread_local std::vector<float> panel;
  return panel;
}

// Rows of x from which a Q8_0 or bf16 matmul widens each panel once into fp32 instead of in registers for
// every six rows.
constexpr int64_t kWidenRows = 4;

// Every panel (threads split them) against every row of x, six rows at a time.
template <typename Rows>
void for_each_panel(int64_t m_size, int64_t num_panels, int64_t out_features, const Rows& rows) {
  at::parallel_for(0, num_panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t cols = std::min<int64_t>(16, out_features - p * 16);
      int64_t m = 0;
      for (; m + 6 <= m_size; m += 6) rows(std::integral_constant<int, 6>{}, p, m, cols);
      switch (m_size - m) {
        case 5: rows(std::integral_constant<int, 5>{}, p, m, cols); break;
        case 4: rows(std::integral_constant<int, 4>{}, p, m, cols); break;
        case 3: rows(std::integral_constant<int, 3>{}, p, m, cols); break;
        case 2: rows(std::integral_constant<int, 2>{}, p, m, cols); break;
        case 1: rows(std::integral_constant<int, 1>{}, p, m, cols); break;
        default: break;
      }
    }
  });
}

const float* checked_bias(const std::optional<torch::Tensor>& bias, int64_t out_features) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->dtype() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == out_features,
              "panel_linear: bias must be fp32 [N]");
  return bias->data_ptr<float>();
}

void check_x(const torch::Tensor& x, int64_t k_size, int64_t num_panels, int64_t out_features) {
  TORCH_CHECK(x.dtype() == torch::kFloat32, "panel_linear: fp32 activations only");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "panel_linear: x must be [M, K], contiguous");
  TORCH_CHECK(x.size(1) == k_size, "panel_linear: x has ", x.size(1), " features, the weight ", k_size);
  TORCH_CHECK(out_features > 16 * (num_panels - 1) && out_features <= 16 * num_panels,
              "panel_linear: ", num_panels, " panels cannot hold ", out_features, " features");
}

}  // namespace

torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& panels,
                           const std::optional<torch::Tensor>& bias, int64_t out_features) {
  const bool bf16 = panels.dtype() == torch::kBFloat16;
  TORCH_CHECK((bf16 || panels.dtype() == torch::kFloat32) && panels.dim() == 3 && panels.is_contiguous() &&
                  panels.size(2) == 16,
              "panel_linear: fp32 or bf16 panels [P, K, 16], contiguous");
  const int64_t k_size = panels.size(1), num_panels = panels.size(0), m_size = x.size(0);
  check_x(x, k_size, num_panels, out_features);
  const float* b = checked_bias(bias, out_features);
  auto out = torch::empty({m_size, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (!bf16 || m_size < kWidenRows) {
    const auto run = [&](const auto* wp) {
      for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
        panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, wp + p * k_size * 16,
                                          b == nullptr ? nullptr : b + p * 16,
                                          op + m * out_features + p * 16, out_features, cols);
      });
    };
    if (bf16)
      run(reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()));
    else
      run(panels.data_ptr<float>());
    return out;
  }
  // Many rows over bf16: widen the panel once into an fp32 one (in cache), which every row then reads.
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
    std::vector<float>& panel = widened_panel();
    if (m == 0) {
      panel.resize(k_size * 16);
      widen_panel(wp + p * k_size * 16, k_size, panel.data());
    }
    panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, panel.data(), b == nullptr ? nullptr : b + p * 16,
                                      op + m * out_features + p * 16, out_features, cols);
  });
  return out;
}

torch::Tensor q8_panel_linear(const torch::Tensor& x, const torch::Tensor& panels,
                              const torch::Tensor& scales, const std::optional<torch::Tensor>& bias,
                              int64_t out_features) {
  TORCH_CHECK(panels.dtype() == torch::kInt8 && panels.dim() == 4 && panels.is_contiguous() &&
                  panels.size(2) == 32 && panels.size(3) == 16,
              "q8_panel_linear: int8 panels [P, K / 32, 32, 16], contiguous");
  const int64_t num_panels = panels.size(0), num_blocks = panels.size(1), k_size = x.size(1);
  TORCH_CHECK(scales.dtype() == torch::kFloat32 && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == num_panels && scales.size(1) == num_blocks && scales.size(2) == 16,
              "q8_panel_linear: fp32 scales [P, K / 32, 16], contiguous");
  TORCH_CHECK((k_size + 31) / 32 == num_blocks, "panel_linear: x has ", k_size,
              " features, the weight ", num_blocks, " blocks of 32");
  check_x(x, k_size, num_panels, out_features);
  const float* b = checked_bias(bias, out_features);
  auto out = torch::empty({x.size(0), out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = panels.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t m_size = x.size(0), block_bytes = 32 * 16;
  if (m_size < kWidenRows) {  // each weight is used by few rows: widen it in registers
    for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
      q8_panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, wp + p * num_blocks * block_bytes,
                                           sp + p * num_blocks * 16, b == nullptr ? nullptr : b + p * 16,
                                           op + m * out_features + p * 16, out_features, cols);
    });
    return out;
  }
  // Many rows: widen the panel once into an fp32 one (in cache), which every row then reads.
  for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
    std::vector<float>& panel = widened_panel();
    if (m == 0) {
      panel.resize(num_blocks * 32 * 16);
      widen_panel(wp + p * num_blocks * block_bytes, sp + p * num_blocks * 16, num_blocks, panel.data());
    }
    panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, panel.data(), b == nullptr ? nullptr : b + p * 16,
                                      op + m * out_features + p * 16, out_features, cols);
  });
  return out;
}

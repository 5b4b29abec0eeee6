// y = x W^T (+ bias), fp32 activations on the CPU, over a weight packed in panels of 16 output
// features: panel p holds features 16p .. 16p+15 as [K][16] (zero rows past N), so a step of the
// inner loop reads 16 consecutive weights and every one of them is used by each row of x.
//
// panel_linear: fp32 weights, or bf16 ones (half the bytes to read).
//   x:       [M, K] fp32, rows contiguous
//   panels:  fp32 [ceil(N / 16), K, 16], or bf16 [ceil(N / 16), ceil(K / 2), 32]: each feature's
//            inputs in pairs (2k, 2k + 1), the layout of AVX512-BF16's pair dot product
//            (stallfree.engine.native.pack_panels)
//   For a few rows each bf16 weight is widened to fp32 (exactly) in registers. For more, on a CPU
//   with AVX512-BF16 the rows of x are rounded to bf16 (to nearest even, as torch rounds) and
//   multiplied in bf16 pairs with fp32 sums, as oneDNN's bf16 matmuls and llama.cpp's BF16 do
//   (STALLFREE_NATIVE_BF16_DOT=0 turns that off); elsewhere each panel is widened once into a
//   per-thread fp32 buffer that every row reads.
//   bias:    [N] fp32 or None
//   returns  [M, N]
// q8_panel_linear: int8 weights in blocks of 32 inputs with one scale each (llama.cpp's Q8_0);
//   for a few rows each block's weights are widened to fp32 in registers; for more, on a CPU with
//   AVX512-BF16 each panel's int8 values become bf16 pairs (exactly) that meet x rounded to bf16
//   in pair dot products, each block's sums scaled once (llama.cpp rounds x to int8 instead);
//   elsewhere each panel is widened once into a per-thread fp32 buffer that every row then reads.
//   panels:  [ceil(N / 16), ceil(K / 32), 32, 16] int8 (zero past N and K)
//   scales:  [ceil(N / 16), ceil(K / 32), 16] fp32
//
// Threads split the panels (torch's pool, torch.set_num_threads); each panel meets every row of x
// while it is in cache, six rows at a time (12 accumulators of 8 floats: the register file's
// worth on AVX2). One stream's decode reads each weight once, at memory speed; prefill's rows
// share every panel read.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
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

typedef uint32_t u32x8 __attribute__((vector_size(32)));

// Eight bf16 pairs as two sets of eight floats (a bf16 is the top half of an fp32): the pairs'
// first inputs and their second.
inline void load_pairs8(const uint32_t* p, f32x8& first, f32x8& second) {
  u32x8 v;
  std::memcpy(&v, p, sizeof v);
  const u32x8 lo = v << 16, hi = v & 0xFFFF0000u;
  std::memcpy(&first, &lo, sizeof first);
  std::memcpy(&second, &hi, sizeof second);
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
  store_rows<R>(lo, hi, bias, out, ld_out, cols);
}

// The same over a bf16 panel of input pairs ([ceil(K / 2)][16] pairs), for a few rows.
template <int R>
inline void bf16_panel_rows(const float* x, int64_t k_size, const uint32_t* panel, const float* bias,
                            float* out, int64_t ld_out, int64_t cols) {
  f32x8 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = f32x8{};
  const int64_t pairs = k_size / 2;
  for (int64_t k = 0; k < pairs; ++k) {
    f32x8 a_lo, b_lo, a_hi, b_hi;
    load_pairs8(panel + k * 16, a_lo, b_lo);
    load_pairs8(panel + k * 16 + 8, a_hi, b_hi);
    for (int r = 0; r < R; ++r) {
      const float va = x[r * k_size + 2 * k], vb = x[r * k_size + 2 * k + 1];
      lo[r] += va * a_lo + vb * b_lo;
      hi[r] += va * a_hi + vb * b_hi;
    }
  }
  if (k_size % 2) {  // the last pair's second input is padding
    f32x8 a_lo, b_lo, a_hi, b_hi;
    load_pairs8(panel + pairs * 16, a_lo, b_lo);
    load_pairs8(panel + pairs * 16 + 8, a_hi, b_hi);
    for (int r = 0; r < R; ++r) {
      const float va = x[r * k_size + k_size - 1];
      lo[r] += va * a_lo;
      hi[r] += va * a_hi;
    }
  }
  store_rows<R>(lo, hi, bias, out, ld_out, cols);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define STALLFREE_BF16_DOT 1
// sums[r][j] += the pair dot products of pairs [k0, k1) of row r of x and panel j.
template <int R, int P>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void bf16_dot_range(
    const uint32_t* xb, int64_t pairs, const uint32_t* panel, int64_t panel_pairs, __m512 (&sums)[R][P],
    int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; ++k) {
    __m512bh w[P];
    for (int j = 0; j < P; ++j) w[j] = (__m512bh)_mm512_loadu_si512(panel + (j * panel_pairs + k) * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh v = (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[r * pairs + k]));
      for (int j = 0; j < P; ++j) sums[r][j] = _mm512_dpbf16_ps(sums[r][j], v, w[j]);
    }
  }
}

// Rows [0, R) of x, as bf16 pairs ([R][pairs]), against P bf16 panels (16 P features) that lie
// panel_pairs pairs apart: one AVX512-BF16 pair dot product per pair of inputs, row and panel;
// each broadcast of x serves P panels. Scaled (a Q8_0 weight's int8 values, widened): each block
// of 16 pairs is summed apart and added times its scales ([P][pairs / 16][16], panels
// `scale_stride` floats apart). out[r][0..cols) = the sums (+ bias).
template <int R, int P, bool Scaled>
__attribute__((target("avx512f,avx512bf16"))) void bf16_dot_rows(const uint32_t* xb, int64_t pairs,
                                                                   const uint32_t* panel, int64_t panel_pairs,
                                                                   const float* scales, int64_t scale_stride,
                                                                   const float* bias, float* out, int64_t ld_out,
                                                                   int64_t cols) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) acc[r][j] = _mm512_setzero_ps();
  if constexpr (Scaled) {
    for (int64_t b = 0; b < pairs / 16; ++b) {
      __m512 block[R][P];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < P; ++j) block[r][j] = _mm512_setzero_ps();
      bf16_dot_range<R, P>(xb, pairs, panel, panel_pairs, block, 16 * b, 16 * b + 16);
      for (int j = 0; j < P; ++j) {
        const __m512 scale = _mm512_loadu_ps(scales + j * scale_stride + b * 16);
        for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(block[r][j], scale, acc[r][j]);
      }
    }
  } else {
    bf16_dot_range<R, P>(xb, pairs, panel, panel_pairs, acc, 0, pairs);
  }
  for (int r = 0; r < R; ++r) {
    float row[16 * P];
    for (int j = 0; j < P; ++j) _mm512_storeu_ps(row + 16 * j, acc[r][j]);
    if (bias != nullptr)
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    std::memcpy(out + r * ld_out, row, cols * sizeof(float));
  }
}

// Rows [m0, m1) of x (as bf16 pairs) against the P panels from `panel` (and their scales where
// Scaled): six rows at a time.
template <int P, bool Scaled>
void bf16_dot_panel_rows(const uint32_t* xb, int64_t pairs, const uint32_t* panel, int64_t panel_pairs,
                         const float* bias, float* out, int64_t ld_out, int64_t cols, int64_t m0, int64_t m1,
                         const float* scales, int64_t scale_stride) {
  const auto rows = [&](auto count, int64_t m) {
    bf16_dot_rows<decltype(count)::value, P, Scaled>(xb + m * pairs, pairs, panel, panel_pairs, scales,
                                                      scale_stride, bias, out + m * ld_out, ld_out, cols);
  };
  int64_t m = m0;
  for (; m + 6 <= m1; m += 6) rows(std::integral_constant<int, 6>{}, m);
  switch (m1 - m) {
    case 5: rows(std::integral_constant<int, 5>{}, m); break;
    case 4: rows(std::integral_constant<int, 4>{}, m); break;
    case 3: rows(std::integral_constant<int, 3>{}, m); break;
    case 2: rows(std::integral_constant<int, 2>{}, m); break;
    case 1: rows(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

// The same for the one or two panels that hold `cols` (up to 32) features.
template <bool Scaled = false>
void bf16_dot_panels(const uint32_t* xb, int64_t pairs, const uint32_t* panel, int64_t panel_pairs,
                     const float* bias, float* out, int64_t ld_out, int64_t cols, int64_t m0, int64_t m1,
                     const float* scales = nullptr, int64_t scale_stride = 0) {
  if (cols > 16)
    bf16_dot_panel_rows<2, Scaled>(xb, pairs, panel, panel_pairs, bias, out, ld_out, cols, m0, m1, scales,
                                   scale_stride);
  else
    bf16_dot_panel_rows<1, Scaled>(xb, pairs, panel, panel_pairs, bias, out, ld_out, cols, m0, m1, scales,
                                   scale_stride);
}

// Q8_0 panels [p, p + count) (count 1 or 2) as bf16 pairs ([count][blocks * 16][16], the int8
// values exactly; their scales stay apart).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void q8_pairs(const int8_t* panels, int64_t num_blocks,
                                                                      int64_t count, uint32_t* out) {
  for (int64_t i = 0; i < count * num_blocks * 16; ++i) {  // a pair of inputs of 16 features
    const int8_t* rows = panels + i * 32;
    const __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows))));
    const __m512 second =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + 16))));
    const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(first), 16);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(second), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    _mm512_storeu_si512(out + i * 16, _mm512_or_si512(lo, hi));
  }
}

// Rows [first, last) of x (rows ld_x floats apart, K used) as bf16 pairs ([M][pairs], zero past
// K), rounded to nearest even as torch rounds (AVX512-BF16 also flushes subnormals, below 1e-38,
// to zero).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void bf16_rows(const float* x, int64_t ld_x,
                                                                                 int64_t k_size, int64_t pairs,
                                                                                 uint16_t* out, int64_t first,
                                                                                 int64_t last) {
  for (int64_t m = first; m < last; ++m) {
    const float* row = x + m * ld_x;
    uint16_t* to = out + m * 2 * pairs;
    for (int64_t k = 0; k < 2 * pairs; k += 16) {
      const __mmask16 in = k + 16 <= k_size ? 0xFFFF : k < k_size ? (1u << (k_size - k)) - 1 : 0;
      const __mmask16 store = k + 16 <= 2 * pairs ? 0xFFFF : (1u << (2 * pairs - k)) - 1;
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(in, row + k));
      _mm256_mask_storeu_epi16(to + k, store, (__m256i)v);
    }
  }
}
#endif

// Whether the many-row bf16 path multiplies in bf16 pairs here.
bool bf16_dot_products() {
#if defined(STALLFREE_BF16_DOT)
  static const bool supported = __builtin_cpu_supports("avx512bf16");
  const char* env = std::getenv("STALLFREE_NATIVE_BF16_DOT");
  return supported && (env == nullptr || std::strcmp(env, "0") != 0);
#else
  return false;
#endif
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

// A bf16 panel of input pairs as an fp32 one ([2 ceil(K / 2)][16]).
inline void widen_panel(const uint32_t* panel, int64_t pairs, float* out) {
  for (int64_t k = 0; k < pairs; ++k)
    for (int64_t half = 0; half < 16; half += 8) {
      f32x8 first, second;
      load_pairs8(panel + k * 16 + half, first, second);
      std::memcpy(out + 2 * k * 16 + half, &first, 32);
      std::memcpy(out + (2 * k + 1) * 16 + half, &second, 32);
    }
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

// Every panel (threads split them) widened once into this thread's fp32 buffer of panel_floats
// (widen(p, buffer)), which every row of x then reads, six rows at a time.
template <typename Widen>
void widened_panels(const float* x, int64_t m_size, int64_t k_size, int64_t num_panels, int64_t out_features,
                    int64_t panel_floats, const float* bias, float* out, const Widen& widen) {
  thread_local std::vector<float> panel;
  for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
    if (m == 0) {
      panel.resize(panel_floats);
      widen(p, panel.data());
    }
    panel_rows<decltype(rows)::value>(x + m * k_size, k_size, panel.data(), bias == nullptr ? nullptr : bias + p * 16,
                                      out + m * out_features + p * 16, out_features, cols);
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

#if defined(STALLFREE_BF16_DOT)
// x ([M, K] fp32) as bf16 pairs, [M, 2 pairs] (zero past K).
torch::Tensor bf16_pairs_of(const torch::Tensor& x, int64_t pairs) {
  const int64_t m_size = x.size(0), k_size = x.size(1);
  auto out = torch::empty({m_size, 2 * pairs}, x.options().dtype(torch::kBFloat16));
  uint16_t* to = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* from = x.data_ptr<float>();
  at::parallel_for(0, m_size, 16, [&](int64_t first, int64_t last) {
    bf16_rows(from, k_size, k_size, pairs, to, first, last);
  });
  return out;
}

// panels(p, cols, m0, m1) for every pair of panels p, p + 1 (cols: their features, up to 32) and
// rows in blocks of 96, whose bf16 pairs stay in cache while every panel meets them; threads split
// the panels two by two.
template <typename Panels>
void dot_panel_pairs(int64_t m_size, int64_t num_panels, int64_t out_features, const Panels& panels) {
  constexpr int64_t block_rows = 96;
  for (int64_t m0 = 0; m0 < m_size; m0 += block_rows) {
    const int64_t m1 = std::min(m_size, m0 + block_rows);
    at::parallel_for(0, (num_panels + 1) / 2, 1, [&](int64_t first, int64_t last) {
      for (int64_t two = first; two < last; ++two)
        panels(2 * two, std::min<int64_t>(32, out_features - 2 * two * 16), m0, m1);
    });
  }
}
#endif

torch::Tensor bf16_panel_linear(const torch::Tensor& x, const torch::Tensor& panels,
                                const std::optional<torch::Tensor>& bias, int64_t out_features) {
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.size(2) == 32,
              "panel_linear: fp32 panels [P, K, 16] or bf16 ones [P, K / 2, 32], contiguous");
  TORCH_CHECK(x.dim() == 2, "panel_linear: x must be [M, K], contiguous");
  const int64_t pairs = panels.size(1), num_panels = panels.size(0), m_size = x.size(0);
  const int64_t k_size = x.size(1);
  TORCH_CHECK((k_size + 1) / 2 == pairs, "panel_linear: x has ", k_size, " features, the weight ", pairs,
              " pairs");
  check_x(x, k_size, num_panels, out_features);
  const float* b = checked_bias(bias, out_features);
  auto out = torch::empty({m_size, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(panels.data_ptr<at::BFloat16>());
  const auto bias_of = [&](int64_t p) { return b == nullptr ? nullptr : b + p * 16; };
  if (m_size < kWidenRows) {  // each weight is used by few rows: widen it in registers
    for_each_panel(m_size, num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
      bf16_panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, wp + p * pairs * 16, bias_of(p),
                                             op + m * out_features + p * 16, out_features, cols);
    });
    return out;
  }
#if defined(STALLFREE_BF16_DOT)
  if (bf16_dot_products()) {
    const auto x_bf16 = bf16_pairs_of(x, pairs);
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(x_bf16.data_ptr<at::BFloat16>());
    dot_panel_pairs(m_size, num_panels, out_features, [&](int64_t p, int64_t cols, int64_t m0, int64_t m1) {
      bf16_dot_panels(xb, pairs, wp + p * pairs * 16, pairs, bias_of(p), op + p * 16, out_features, cols, m0, m1);
    });
    return out;
  }
#endif
  // Many rows: widen each panel once into an fp32 one (in cache), which every row then reads.
  widened_panels(xp, m_size, k_size, num_panels, out_features, pairs * 2 * 16, b, op,
                 [&](int64_t p, float* panel) { widen_panel(wp + p * pairs * 16, pairs, panel); });
  return out;
}

}  // namespace

torch::Tensor panel_linear(const torch::Tensor& x, const torch::Tensor& panels,
                           const std::optional<torch::Tensor>& bias, int64_t out_features) {
  if (panels.dtype() == torch::kBFloat16) return bf16_panel_linear(x, panels, bias, out_features);
  TORCH_CHECK(panels.dtype() == torch::kFloat32 && panels.dim() == 3 && panels.is_contiguous() &&
                  panels.size(2) == 16,
              "panel_linear: fp32 panels [P, K, 16] or bf16 ones [P, K / 2, 32], contiguous");
  const int64_t k_size = panels.size(1), num_panels = panels.size(0);
  check_x(x, k_size, num_panels, out_features);
  const float* b = checked_bias(bias, out_features);
  auto out = torch::empty({x.size(0), out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for_each_panel(x.size(0), num_panels, out_features, [&](auto rows, int64_t p, int64_t m, int64_t cols) {
    panel_rows<decltype(rows)::value>(xp + m * k_size, k_size, wp + p * k_size * 16,
                                      b == nullptr ? nullptr : b + p * 16,
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
#if defined(STALLFREE_BF16_DOT)
  if (bf16_dot_products()) {  // int8 values exactly as bf16, x rounded to bf16, block sums scaled
    const int64_t pairs = num_blocks * 16;
    const auto x_bf16 = bf16_pairs_of(x, pairs);
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(x_bf16.data_ptr<at::BFloat16>());
    thread_local std::vector<uint32_t> widened;
    dot_panel_pairs(m_size, num_panels, out_features, [&](int64_t p, int64_t cols, int64_t m0, int64_t m1) {
      widened.resize(2 * pairs * 16);
      q8_pairs(wp + p * num_blocks * block_bytes, num_blocks, cols > 16 ? 2 : 1, widened.data());
      bf16_dot_panels<true>(xb, pairs, widened.data(), pairs, b == nullptr ? nullptr : b + p * 16, op + p * 16,
                            out_features, cols, m0, m1, sp + p * num_blocks * 16, pairs);
    });
    return out;
  }
#endif
  // Many rows: widen each panel once into an fp32 one (in cache), which every row then reads.
  widened_panels(xp, m_size, k_size, num_panels, out_features, num_blocks * 32 * 16, b, op, [&](int64_t p, float* panel) {
    widen_panel(wp + p * num_blocks * block_bytes, sp + p * num_blocks * 16, num_blocks, panel);
  });
  return out;
}

// For Python: whether a bf16 matmul of 4 rows or more multiplies in bf16 pairs on this CPU.
bool uses_bf16_dot_products() { return bf16_dot_products(); }

// pardec's products for float32 activations on CPUs with AVX2 and FMA (no AVX512 needed):
//   pardec_avx2::f32_mm  float32 weights w [N, K] (an nn.Linear's own, not copied):
//                        dense layers and the output head in float32;
//   pardec_avx2::q8f32_mm  int8 weights q [N, K] with one float32 scale per output
//                        (`quant.Int8Linear`'s own): y = (x @ q.T) * scale;
//   pardec_avx2::q4q8_mm  4-bit weights in `quant.Int4Records`' layout (GGUF Q4_1's
//                        w = q * d + m) by activations quantized to int8 in groups of 32,
//                        as llama.cpp multiplies Q4_1 by Q8_1: --weights q4q8 on AVX2;
//   pardec_avx2::q8q8_mm  int8 weights (one scale per output: the head's) by activations
//                        quantized to int8 in groups of 32, as llama.cpp's Q8_0 by Q8_0;
//   pardec_avx2::q8q8_blocks_mm  int8 weights with a scale per output and group of 32
//                        (`quant.Q8Records`, llama.cpp's Q8_0 weights) by the same
//                        activation groups: --weights q8q8;
//   pardec_avx2::attention  a few query rows' attention over a float32 or float16 cache,
//                        each row computed alone (engine/attention.py).
// Built at run time by torch.utils.cpp_extension (pardec_cli/kernels.py).
//
// For the few rows of a decoding or verifying step, torch's float32 mm (MKL) read the
// weights of SmolLM2-135M at ~13 GB/s for one row and its time doubled from one row to
// two on a 2-core AVX2 EPYC (docs/runner.md, "float32 on AVX2"). Here each block of 4
// outputs streams its 4 weight rows once and multiplies them by the activation rows in
// pairs (the block's rows stay in L1 for the later pairs).
// Every (row, output) is summed in the same order, 8 lanes over k then the lanes, whatever
// the number of rows or how they are paired: a row's result does not depend on the rows
// around it, so a verifying step's rows equal one-token steps bit for bit.
//
// q4q8_mm's weights: uint8 [N/16, K/32, 320], one record per block of 16 outputs and group
// of 32 inputs: 256 bytes of codes, 16 f16 scales d, 16 f16 minimums m. Byte 4 * i + b of
// code chunk p (64 bytes) holds q[i, 8p + b] in its low nibble and q[i, 8p + 4 + b] in its
// high one (int4_kernels.cpp writes the same layout for AVX512-VNNI). Each row's groups of
// 32 activations become int8 codes with d_x = max|x| / 127 and their float sum s_x:
//   y[r, n] = sum_g d[n, g] d_x[r, g] sum_k q[n, k] q_x[r, k] + m[n, g] s_x[r, g].
// VPMADDUBSW multiplies 8 outputs' 4 codes (0..15) by 4 activation codes (|q_x| <= 127)
// and adds pairs into int16: a group's 8 of them per lane sum to at most 8 * 2 * 15 * 127
// = 30480, so the group's integer sums are exact in int16 until one VPMADDWD widens them.
// Built for a CPU with AVX512-VNNI (`kernels.AVX2_VNNI`: -mavx512vnni -mavx512vl), one
// VPDPBUSD adds a lane's 4 products to its int32 sum instead: the same exact integers, so
// the same bits, in a third of the instructions (docs/runner.md, "VNNI").
// The tensor type and the one op used (at::empty), not <ATen/ATen.h>: every op's declarations
// took 11 of the build's 21 s on a 2-core AVX2 machine (now 7 of 15), and a first run waits for it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kOut = 4;  // outputs per block

// Byte products: acc's int32 lane i plus the sum over its 4 bytes of u (unsigned) times s
// (signed), for the two pairs (u0, s0) and (u1, s1). Without VNNI, acc holds int16 pair
// sums (exact while they stay in range; see above) until `widen` makes them int32 lanes.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
inline __m256i add_products(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u0, s0), u1, s1);
}
inline __m256i add_products(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i widen(__m256i acc) { return acc; }
#else
inline __m256i add_products(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)));
}
inline __m256i add_products(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s)); }
inline __m256i widen(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#endif

inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 8 consecutive weights as floats.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// The weights `kAhead` rows on from w + k into L2, once per 64-byte line: the next blocks'
// rows (int8 weights read 8.5 instead of 13 ms per SmolLM2-135M step with them into L1;
// into L2, which holds no L1 miss buffer for a memory latency, 1.6x faster again for one
// row and 1.3-1.4x for two, float32 weights at par: docs/runner.md).
template <typename T>
inline void prefetch_ahead(const T* const* w, int64_t k, int64_t K) {
  constexpr int64_t kAhead = sizeof(T) == 1 ? 8 : 4;
  if ((k * static_cast<int64_t>(sizeof(T))) % 64 != 0) return;
  for (int64_t j = 0; j < kOut; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + k + kAhead * K), _MM_HINT_T1);
}

// Rows x0 and x1 by the block's 4 weight rows w[0..3]; the sums of
// output j go to s0[j] and s1[j].
template <typename T>
inline void block_pair(const float* x0, const float* x1, const T* const* w, int64_t K, float* s0, float* s1) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t k = 0; k < K; k += 8) {
    prefetch_ahead(w, k, K);
    const __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
    __m256 q = load8(w[0] + k);
    a0 = _mm256_fmadd_ps(v0, q, a0); b0 = _mm256_fmadd_ps(v1, q, b0);
    q = load8(w[1] + k);
    a1 = _mm256_fmadd_ps(v0, q, a1); b1 = _mm256_fmadd_ps(v1, q, b1);
    q = load8(w[2] + k);
    a2 = _mm256_fmadd_ps(v0, q, a2); b2 = _mm256_fmadd_ps(v1, q, b2);
    q = load8(w[3] + k);
    a3 = _mm256_fmadd_ps(v0, q, a3); b3 = _mm256_fmadd_ps(v1, q, b3);
  }
  s0[0] = lane_sum(a0); s0[1] = lane_sum(a1); s0[2] = lane_sum(a2); s0[3] = lane_sum(a3);
  s1[0] = lane_sum(b0); s1[1] = lane_sum(b1); s1[2] = lane_sum(b2); s1[3] = lane_sum(b3);
}

// Row x0 alone by the block's 4 weight rows: the same sums as `block_pair`'s s0.
template <typename T>
inline void block_one(const float* x0, const T* const* w, int64_t K, float* s0) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t k = 0; k < K; k += 8) {
    prefetch_ahead(w, k, K);
    const __m256 v0 = _mm256_loadu_ps(x0 + k);
    a0 = _mm256_fmadd_ps(v0, load8(w[0] + k), a0);
    a1 = _mm256_fmadd_ps(v0, load8(w[1] + k), a1);
    a2 = _mm256_fmadd_ps(v0, load8(w[2] + k), a2);
    a3 = _mm256_fmadd_ps(v0, load8(w[3] + k), a3);
  }
  s0[0] = lane_sum(a0); s0[1] = lane_sum(a1); s0[2] = lane_sum(a2); s0[3] = lane_sum(a3);
}

// y [M, N] = (x [M, K] @ w [N, K].T) * scale[n] (scale null: 1).
template <typename T>
at::Tensor product(const at::Tensor& x_in, const at::Tensor& w, const float* scale) {
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const T* W = w.data_ptr<T>();
  float* Y = y.data_ptr<float>();
  // 16 blocks (64 outputs) at least per task: torch's threads take contiguous ranges.
  at::parallel_for(0, (N + kOut - 1) / kOut, 16, [&](int64_t b0, int64_t b1) {
    float s0[kOut], s1[kOut];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kOut, outs = std::min(kOut, N - n0);
      const T* rows[kOut];
      for (int64_t j = 0; j < kOut; ++j) rows[j] = W + (n0 + std::min(j, outs - 1)) * K;  // a short block repeats its last row
      for (int64_t m = 0; m < M; m += 2) {
        const bool pair = m + 1 < M;
        if (pair) {
          block_pair(X + m * K, X + (m + 1) * K, rows, K, s0, s1);
        } else {
          block_one(X + m * K, rows, K, s0);
        }
        for (int64_t j = 0; j < outs; ++j) {
          const float sc = scale ? scale[n0 + j] : 1.0f;
          Y[m * N + n0 + j] = scale ? s0[j] * sc : s0[j];
          if (pair) Y[(m + 1) * N + n0 + j] = scale ? s1[j] * sc : s1[j];
        }
      }
    }
  });
  return y;
}

void check(const at::Tensor& x, const at::Tensor& w, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == at::kFloat, op, ": x must be 2-D float32 on a CPU");
  TORCH_CHECK(w.dim() == 2 && w.device().is_cpu() && w.is_contiguous(), op, ": w must be a contiguous 2-D CPU tensor [N, K]");
  TORCH_CHECK(w.size(1) == x.size(1) && x.size(1) % 8 == 0 && w.size(0) > 0, op, ": x [M, K] and w [N, K] need the same K, a multiple of 8");
}

at::Tensor f32_mm(const at::Tensor& x, const at::Tensor& w) {
  check(x, w, "f32_mm");
  TORCH_CHECK(w.scalar_type() == at::kFloat, "f32_mm: w must be float32");
  return product<float>(x, w, nullptr);
}

at::Tensor q8f32_mm(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  check(x, q, "q8f32_mm");
  TORCH_CHECK(q.scalar_type() == at::kChar, "q8f32_mm: q must be int8");
  TORCH_CHECK(scales.dim() == 1 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.size(0) == q.size(0),
              "q8f32_mm: scales must be contiguous float32 [N]");
  return product<int8_t>(x, q, scales.data_ptr<float>());
}

// ---- q4q8_mm: 4-bit records by int8 activation groups.

constexpr int64_t kGroup = 32, kBlock = 16, kRecord = 320;
// Rows per pass over a block's records: on 16 ymm registers 4 beat 1, 2 and 8 at 8-16
// rows (same at 1-2); the 512-bit kernel below keeps 8 rows' sums in 16 of its 32. The
// records 32 ahead (10 KB) are prefetched into L2, not L1: a prefetch into L1 holds one of
// the core's few L1 miss buffers for a whole memory latency, and with 2-4 rows' work
// between loads the products streamed 15-20 GB/s of a 30+ GB/s machine (L2: 1.2-1.3x
// faster at 2-4 rows on a loaded Zen 4, par at one row; docs/runner.md). 8 to 64 ahead
// measured alike within noise.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define PARDEC_Q4_512 1
constexpr int64_t kMaxRows = 8;
#else
constexpr int64_t kMaxRows = 4;
#endif
constexpr int64_t kPrefetch = 32 * kRecord;

inline float lane_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// One group of 32 activations to int8 codes (rounded to nearest even), d_x and s_x.
inline void quantize_group(const float* x, int8_t* q, float* d_out, float* s_out) {
  const __m256 a0 = _mm256_loadu_ps(x), a1 = _mm256_loadu_ps(x + 8), a2 = _mm256_loadu_ps(x + 16), a3 = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a0), _mm256_andnot_ps(sign, a1)),
                                    _mm256_max_ps(_mm256_andnot_ps(sign, a2), _mm256_andnot_ps(sign, a3)));
  const float d = lane_max(amax) / 127.0f;
  const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(a0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(a1, inv));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(a2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(a3, inv));
  // packs interleave the 128-bit lanes: 4-byte pieces come out as i0 i1 i2 i3 (low halves)
  // then the high halves; the permutation puts them back in order.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  *d_out = d;
  *s_out = lane_sum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// Rows this many or more are shared out over torch's threads by `each_row`: a wide step's
// per-row work (the activations' quantization, norms, RoPE, SiLU) ran on one thread while
// the others waited (at 16 rows ~6% of a native step on a 2-core Zen 4, and the idle
// thread's wait as much again). A fork and join costs ~1 us; each row's arithmetic is the
// same whichever thread does it.
constexpr int64_t kParallelRows = 4;

template <typename F>
inline void each_row(int64_t R, F&& f) {
  if (R < kParallelRows) {
    for (int64_t r = 0; r < R; ++r) f(r);
    return;
  }
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) f(r);
  });
}

// M rows x [M, K] (rows ldx apart) to their int8 groups: codes qx [M, K], d_x and s_x [M, K/32].
inline void quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, int8_t* qx, float* dx, float* sx) {
  const int64_t G = K / kGroup;
  each_row(M, [&](int64_t r) {
    for (int64_t g = 0; g < G; ++g) quantize_group(x + r * ldx + g * kGroup, qx + r * K + g * kGroup, dx + r * G + g, sx + r * G + g);
  });
}

// R rows (codes qx [R, K], d_x and s_x [R, G]) by one block's G records -> out [R, 16].
template <int R>
void q4_block_rows(const int8_t* qx, const float* dx, const float* sx, int64_t K, int64_t G, const uint8_t* w, float* out,
                   int64_t ldo) {
  __m256 acc0[R], acc1[R];  // outputs 0-7 and 8-15
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = w + g * kRecord;
    for (int64_t line = 0; line < kRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + line), _MM_HINT_T1);
    __m256i dot0[R], dot1[R];  // `add_products` sums
    for (int r = 0; r < R; ++r) dot0[r] = dot1[r] = _mm256_setzero_si256();
    // Not unrolled: unrolled, GCC computed all 16 products first and spilled them (16 rows
    // took 1.3x as long).
#pragma GCC unroll 1
    for (int p = 0; p < 4; ++p) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * p));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * p + 32));
      const __m256i lo0 = _mm256_and_si256(v0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
      const __m256i lo1 = _mm256_and_si256(v1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = qx + r * K + g * kGroup + 8 * p;
        int32_t xa, xb;
        __builtin_memcpy(&xa, x, 4);
        __builtin_memcpy(&xb, x + 4, 4);
        const __m256i va = _mm256_set1_epi32(xa), vb = _mm256_set1_epi32(xb);
        dot0[r] = add_products(dot0[r], lo0, va, hi0, vb);
        dot1[r] = add_products(dot1[r], lo1, va, hi1, vb);
      }
    }
    const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 256)));
    const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 272)));
    const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 288)));
    const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 304)));
    for (int r = 0; r < R; ++r) {
      const __m256 ddx = _mm256_set1_ps(dx[r * G + g]), s = _mm256_set1_ps(sx[r * G + g]);
      acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(dot0[r])), _mm256_mul_ps(d0, ddx), acc0[r]);
      acc0[r] = _mm256_fmadd_ps(m0, s, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(dot1[r])), _mm256_mul_ps(d1, ddx), acc1[r]);
      acc1[r] = _mm256_fmadd_ps(m1, s, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * ldo, acc0[r]);
    _mm256_storeu_ps(out + r * ldo + 8, acc1[r]);
  }
}

#ifdef PARDEC_Q4_512
// `q4_block_rows` on 512-bit registers (the VNNI build, -mavx512bw): one register holds
// the block's 16 outputs, the ymm kernel's two halves side by side, so per lane the same
// integer products and the same float steps in the same order: the same bits, for half
// the instructions. 8 rows verified 1.1-1.3x as fast as on ymm registers with 4-row tiles
// on a Zen 4 EPYC (which runs 512-bit operations on 256-bit units; docs/runner.md).
template <int R>
void q4_block_rows_512(const int8_t* qx, const float* dx, const float* sx, int64_t K, int64_t G, const uint8_t* w, float* out,
                       int64_t ldo) {
  __m512 acc[R];  // outputs 0-15
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = w + g * kRecord;
    for (int64_t line = 0; line < kRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + line), _MM_HINT_T1);
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(rec + 64 * p);  // code chunk p: outputs 0-7, then 8-15
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = qx + r * K + g * kGroup + 8 * p;
        int32_t xa, xb;
        __builtin_memcpy(&xa, x, 4);
        __builtin_memcpy(&xb, x + 4, 4);
        dot[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(xa)), hi, _mm512_set1_epi32(xb));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 288)));
    for (int r = 0; r < R; ++r) {
      const __m512 ddx = _mm512_set1_ps(dx[r * G + g]), s = _mm512_set1_ps(sx[r * G + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, ddx), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}
#endif

using Q4BlockRows = void (*)(const int8_t*, const float*, const float*, int64_t, int64_t, const uint8_t*, float*, int64_t);
#ifdef PARDEC_Q4_512
constexpr Q4BlockRows kQ4BlockRows[kMaxRows + 1] = {nullptr, q4_block_rows_512<1>, q4_block_rows_512<2>, q4_block_rows_512<3>,
                                                    q4_block_rows_512<4>, q4_block_rows_512<5>, q4_block_rows_512<6>,
                                                    q4_block_rows_512<7>, q4_block_rows_512<8>};
#else
constexpr Q4BlockRows kQ4BlockRows[kMaxRows + 1] = {nullptr, q4_block_rows<1>, q4_block_rows<2>, q4_block_rows<3>, q4_block_rows<4>};
#endif

// M rows x [M, K] (float32, rows ldx apart) by records w [n/16, K/32, 320] -> out [M, n]
// (rows ldo apart). qx [M, K], dx and sx [M, K/32]: room for the rows' int8 groups.
void q4q8_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const uint8_t* w, int64_t n, float* out, int64_t ldo,
               int8_t* qx, float* dx, float* sx) {
  const int64_t G = K / kGroup, NB = n / kBlock;
  quantize_rows(x, ldx, M, K, qx, dx, sx);
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t r0 = 0; r0 < M; r0 += kMaxRows) {
        kQ4BlockRows[std::min(kMaxRows, M - r0)](qx + r0 * K, dx + r0 * G, sx + r0 * G, K, G, w + nb * G * kRecord,
                                                 out + r0 * ldo + nb * kBlock, ldo);
      }
    }
  });
}

// x [M, K] (any float dtype) -> [M, n] float32.
at::Tensor q4q8_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && at::isFloatingType(x_in.scalar_type()),
              "q4q8_mm: x must be a 2-D floating-point CPU tensor");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kRecord && w.scalar_type() == at::kByte && w.is_contiguous() && w.device().is_cpu(),
              "q4q8_mm: w must be contiguous uint8 [N/16, K/32, 320]");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / kGroup, NB = n / kBlock;
  TORCH_CHECK(K % kGroup == 0 && n % kBlock == 0 && w.size(0) == NB && w.size(1) == G,
              "q4q8_mm: shapes do not match: x ", x_in.sizes(), ", w ", w.sizes(), ", n ", n);
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  at::Tensor qx = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({2, M, G}, x.options());  // d_x, then s_x
  float* dp = scales.data_ptr<float>();
  q4q8_rows(x.data_ptr<float>(), K, M, K, w.data_ptr<uint8_t>(), n, out.data_ptr<float>(), n, qx.data_ptr<int8_t>(), dp, dp + M * G);
  return out;
}

// ---- q8q8_mm: int8 weights (one float32 scale per output, the head's) by activations
// quantized to int8 in groups of 32 (`quantize_group`), as llama.cpp multiplies Q8_0 by Q8_0:
//   y[r, n] = scale[n] sum_g d_x[r, g] sum_k q[n, k] q_x[r, k].
// The codes come in records of 16 outputs by a group of 32 inputs (`quant.pack_head`):
// int8 [ceil(N/16), K/32, 512], byte 64 p + 4 i + b of a record holding q[i, 4p + b]. So one
// register holds 16 (or 8) outputs' next 4 codes and a row's 4 activation codes are one
// broadcast: a group's integer sum for 16 outputs takes 8 VPDPBUSD and one float step
// (the old layout, one output per 32-byte row, paid a conversion and an FMA per group and
// output: 16 rows of the head took ~4.2 ms of a 15.6 ms step on a Zen 4; docs/runner.md).
// VPDPBUSD wants unsigned weights: q + 128 (the sign bit flipped), its sums less 128 times
// the group's activation codes' sum. Without VNNI, VPMADDUBSW multiplies |q| by q_x with
// q's sign (a pair at most 2 * 128 * 127 in int16) and VPMADDWD widens each pair (about
// as fast as the old layout there: docs/runner.md). Either way a group's sum is the exact integer, so both builds
// give the same bits. Each (row, output) sums its groups in order: rows stay alone.

constexpr int64_t kHeadRecord = 512;  // bytes per (16 outputs, 32 inputs)
// Records 128 ahead (64 KB) are fetched into L2: with the head cold (as a step reads it,
// after every layer's weights) that beat fetching 1-48 KB ahead into L1, or nothing, at
// 1-16 rows on a Zen 4 (docs/runner.md).
constexpr int64_t kHeadPrefetch = 128 * kHeadRecord;
#ifdef PARDEC_Q4_512
constexpr int64_t kHeadRows = 8;
#else
constexpr int64_t kHeadRows = 4;
#endif

inline int32_t four_codes(const int8_t* x) {
  int32_t v;
  __builtin_memcpy(&v, x, 4);
  return v;
}

// R rows (codes qx [R, K], d_x [R, G], cx [R, G]: -128 times each group's code sum) by one
// block's G records w -> out [R, 16] (rows ldo apart). The head's (`Groups` false): each
// output times scale [16] at the end. q8q8's (`Groups`, `quant.Q8Records`: llama.cpp's Q8_0
// by Q8_0): each group's sum times its own float16 scales ws [G, 16] (`scale` unused).
template <int R, bool Groups>
void q8_rows(const int8_t* qx, const float* dx, const int32_t* cx, int64_t K, int64_t G, const int8_t* w, const float* scale,
             const uint16_t* ws, float* out, int64_t ldo) {
  // Records ahead, into L2: the head's 128 (64 KB; it is read cold, after every layer),
  // q8q8's 32 (as q4q8's records).
  constexpr int64_t ahead = Groups ? 32 : kHeadPrefetch / kHeadRecord;
#ifdef PARDEC_Q4_512
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* rec = w + g * kHeadRecord;
    for (int64_t line = 0; line < kHeadRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + ahead * kHeadRecord + line), _MM_HINT_T1);
    __m512 d = _mm512_setzero_ps();
    if constexpr (Groups) {
      _mm_prefetch(reinterpret_cast<const char*>(ws + (g + ahead) * kBlock), _MM_HINT_T1);
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + g * kBlock)));
    }
    __m512i u[8];  // q + 128
    for (int p = 0; p < 8; ++p) u[p] = _mm512_xor_si512(_mm512_loadu_si512(rec + 64 * p), flip);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = qx + r * K + g * kGroup;
      __m512i s0 = _mm512_set1_epi32(cx[r * G + g]), s1 = _mm512_setzero_si512();  // two chains of 4
      for (int p = 0; p < 8; p += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u[p], _mm512_set1_epi32(four_codes(x + 4 * p)));
        s1 = _mm512_dpbusd_epi32(s1, u[p + 1], _mm512_set1_epi32(four_codes(x + 4 * p + 4)));
      }
      const __m512 dxr = _mm512_set1_ps(dx[r * G + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), Groups ? _mm512_mul_ps(d, dxr) : dxr, acc[r]);
    }
  }
  if constexpr (Groups) {
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
  } else {
    const __m512 sc = _mm512_loadu_ps(scale);
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, _mm512_mul_ps(acc[r], sc));
  }
#else
  (void)cx;
  // Each record in one pass: its two halves (outputs 0-7, 8-15) as each 64-byte line of
  // codes arrives, |q| shared by the rows. A pass per half (the half's 8 |q| registers kept
  // for all rows) was slower: one-token steps 2-4%, 4-row ones 3-5% (every product 10-13% on
  // --weights q8q8; docs/runner.md, "Int8 records in one pass"). Integer sums are exact, so how
  // they are chained does not change a bit.
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* rec = w + g * kHeadRecord;
    for (int64_t line = 0; line < kHeadRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + ahead * kHeadRecord + line), _MM_HINT_T1);
    if constexpr (Groups) _mm_prefetch(reinterpret_cast<const char*>(ws + (g + ahead) * kBlock), _MM_HINT_T1);
    __m256i s[R][2];  // row r's integer sums of outputs 0-7 and 8-15
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * p));
      const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * p + 32));
      const __m256i a0 = _mm256_abs_epi8(q0), a1 = _mm256_abs_epi8(q1);
      for (int r = 0; r < R; ++r) {  // |q| by x with q's sign
        const __m256i xr = _mm256_set1_epi32(four_codes(qx + r * K + g * kGroup + 4 * p));
        s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xr, q0)), ones));
        s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xr, q1)), ones));
      }
    }
    for (int half = 0; half < 2; ++half) {
      __m256 d = _mm256_setzero_ps();
      if constexpr (Groups) d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + g * kBlock + 8 * half)));
      for (int r = 0; r < R; ++r) {
        const __m256 dxr = _mm256_set1_ps(dx[r * G + g]);
        acc[r][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][half]), Groups ? _mm256_mul_ps(d, dxr) : dxr, acc[r][half]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_ps(out + r * ldo + 8 * half, Groups ? acc[r][half] : _mm256_mul_ps(acc[r][half], _mm256_loadu_ps(scale + 8 * half)));
    }
  }
#endif
}

using Q8Rows = void (*)(const int8_t*, const float*, const int32_t*, int64_t, int64_t, const int8_t*, const float*, const uint16_t*,
                        float*, int64_t);
#ifdef PARDEC_Q4_512
constexpr Q8Rows kQ8HeadRows[kHeadRows + 1] = {nullptr, q8_rows<1, false>, q8_rows<2, false>, q8_rows<3, false>, q8_rows<4, false>,
                                               q8_rows<5, false>, q8_rows<6, false>, q8_rows<7, false>, q8_rows<8, false>};
constexpr Q8Rows kQ8BlockRows[kHeadRows + 1] = {nullptr, q8_rows<1, true>, q8_rows<2, true>, q8_rows<3, true>, q8_rows<4, true>,
                                                q8_rows<5, true>, q8_rows<6, true>, q8_rows<7, true>, q8_rows<8, true>};
#else
constexpr Q8Rows kQ8HeadRows[kHeadRows + 1] = {nullptr, q8_rows<1, false>, q8_rows<2, false>, q8_rows<3, false>, q8_rows<4, false>};
constexpr Q8Rows kQ8BlockRows[kHeadRows + 1] = {nullptr, q8_rows<1, true>, q8_rows<2, true>, q8_rows<3, true>, q8_rows<4, true>};
#endif

// -128 times each group's code sum (VPDPBUSD's correction; the VNNI build's only) into cx [M, G].
inline void code_sums(const int8_t* qx, int64_t M, int64_t G, int32_t* cx) {
#ifdef PARDEC_Q4_512
  for (int64_t i = 0; i < M * G; ++i) {
    int32_t sum = 0;
    for (int64_t k = 0; k < kGroup; ++k) sum += qx[i * kGroup + k];
    cx[i] = -128 * sum;
  }
#else
  (void)qx, (void)M, (void)G, (void)cx;
#endif
}

// x [M, K] float32 (K a multiple of 32) by packed codes w [ceil(N/16), K/32, 512] and scales
// [N] -> y [M, N].
void q8q8_rows(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t N, float* y) {
  const int64_t G = K / kGroup, NB = (N + kBlock - 1) / kBlock;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * G), sx(M * G);  // s_x: unused here (no minimums)
  std::vector<int32_t> cx(M * G);  // VPDPBUSD's correction: read by the VNNI build only
  quantize_rows(x, K, M, K, qx.data(), dx.data(), sx.data());
  code_sums(qx.data(), M, G, cx.data());
  // 4 blocks (64 outputs) at least per task: torch's threads take contiguous ranges.
  at::parallel_for(0, NB, 4, [&](int64_t b0, int64_t b1) {
    alignas(64) float part[kHeadRows * kBlock], part_scale[kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlock, outs = std::min(kBlock, N - n0);
      const int8_t* rec = w + b * G * kHeadRecord;
      for (int64_t r0 = 0; r0 < M; r0 += kHeadRows) {
        const int64_t rows = std::min(kHeadRows, M - r0);
        if (outs == kBlock) {
          kQ8HeadRows[rows](qx.data() + r0 * K, dx.data() + r0 * G, cx.data() + r0 * G, K, G, rec, scale + n0, nullptr, y + r0 * N + n0, N);
          continue;
        }
        // A short last block (its records padded with zero codes): through a buffer.
        std::fill_n(part_scale, kBlock, 0.0f);
        std::copy_n(scale + n0, outs, part_scale);
        kQ8HeadRows[rows](qx.data() + r0 * K, dx.data() + r0 * G, cx.data() + r0 * G, K, G, rec, part_scale, nullptr, part, kBlock);
        for (int64_t r = 0; r < rows; ++r) std::copy_n(part + r * kBlock, outs, y + (r0 + r) * N + n0);
      }
    }
  });
}

// ---- int8 weights in groups of 32 with a scale per (output, group), by int8 activation
// groups: llama.cpp's Q8_0 by Q8_0 (`--weights q8q8`, `quant.Q8Records`). Codes as the
// head's records (`quant.pack_head`: [N/16, K/32, 512]); scales float16 [N/16, K/32, 16]
// (Q8_0's own), a stream of their own so that each record of codes stays on whole cache
// lines. A group's integer sums are exact, as the head's, and each (row, output) adds its
// groups in order, d_w * d_x times the sum (`q8_rows`): both builds give the same bits, and a
// row's result does not depend on the rows beside it.

// M rows x [M, K] (float32, rows ldx apart) by codes w [n/16, K/32, 512] and scales ws
// [n/16, K/32, 16] -> out [M, n] (rows ldo apart). qx [M, K], dx, sx and cx [M, K/32]: room
// for the rows' int8 groups.
void q8q8_block_rows(const float* x, int64_t ldx, int64_t M, int64_t K, const int8_t* w, const uint16_t* ws, int64_t n, float* out,
                     int64_t ldo, int8_t* qx, float* dx, float* sx, int32_t* cx) {
  const int64_t G = K / kGroup, NB = n / kBlock;
  quantize_rows(x, ldx, M, K, qx, dx, sx);
  code_sums(qx, M, G, cx);
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t r0 = 0; r0 < M; r0 += kHeadRows) {
        kQ8BlockRows[std::min(kHeadRows, M - r0)](qx + r0 * K, dx + r0 * G, cx + r0 * G, K, G, w + nb * G * kHeadRecord, nullptr,
                                                  ws + nb * G * kBlock, out + r0 * ldo + nb * kBlock, ldo);
      }
    }
  });
}

void check_q8_blocks(const at::Tensor& w, const at::Tensor& ws, int64_t n, int64_t k, const char* what) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 3 && w.size(0) == n / kBlock && n % kBlock == 0 &&
              w.size(1) == k / kGroup && w.size(2) == kHeadRecord && w.device().is_cpu(), what, ": codes ", w.sizes(),
              " are not int8 [n/16, K/32, 512] for ", n, " x ", k, " weights");
  TORCH_CHECK(ws.scalar_type() == at::kHalf && ws.is_contiguous() && ws.dim() == 3 && ws.size(0) == w.size(0) &&
              ws.size(1) == w.size(1) && ws.size(2) == kBlock && ws.device().is_cpu(), what, ": scales ", ws.sizes(),
              " are not float16 [n/16, K/32, 16]");
}

// x [M, K] (any float dtype) by `quant.Q8Records`' codes and scales -> [M, n] float32.
at::Tensor q8q8_blocks_mm(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& ws) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "q8q8_blocks_mm: x must be 2-D on the CPU");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), n = w.size(0) * kBlock;
  TORCH_CHECK(K % kGroup == 0, "q8q8_blocks_mm: K must be a multiple of 32, got ", K);
  check_q8_blocks(w, ws, n, K, "q8q8_blocks_mm");
  at::Tensor y = at::empty({M, n}, x.options());
  if (M == 0) return y;
  std::vector<int8_t> qx(M * K);
  std::vector<float> dx(M * (K / kGroup)), sx(M * (K / kGroup));
  std::vector<int32_t> cx(M * (K / kGroup));
  q8q8_block_rows(x.data_ptr<float>(), K, M, K, w.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(ws.data_ptr<at::Half>()), n,
                  y.data_ptr<float>(), n, qx.data(), dx.data(), sx.data(), cx.data());
  return y;
}

void check_head(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), op, ": x must be 2-D float32 on the CPU");
  TORCH_CHECK(x.size(1) % kGroup == 0, op, ": K must be a multiple of 32, got ", x.size(1));
  TORCH_CHECK(scales.dim() == 1 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.device().is_cpu() &&
              scales.size(0) > 0, op, ": scales must be contiguous float32 [N]");
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kChar && w.is_contiguous() && w.device().is_cpu() &&
              w.size(0) == (scales.size(0) + kBlock - 1) / kBlock && w.size(1) == x.size(1) / kGroup && w.size(2) == kHeadRecord,
              op, ": w must be contiguous int8 [ceil(N/16), K/32, 512] (quant.pack_head), got ", w.sizes(), " for x ", x.sizes(),
              " and ", scales.size(0), " scales");
}

at::Tensor q8q8_mm(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& scales) {
  check_head(x_in, w, scales, "q8q8_mm");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = scales.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M > 0) q8q8_rows(x.data_ptr<float>(), M, K, w.data_ptr<int8_t>(), scales.data_ptr<float>(), N, y.data_ptr<float>());
  return y;
}

// ---- attention of a few query rows over a float32 cache. As pardec_q4::attention (AVX512,
// bfloat16): every (row, head) is computed by the same instructions whatever the other rows
// and however many keys the window holds beyond the ones its mask lets through: each key's
// score alone, softmax in float32 with an exact zero for masked keys, its sum and the output
// summed over the seen keys in key order. A token's attention is then the same bits in a
// decoding step and in any verifying step (SDPA's were not: with activations rounded to
// int8 by q4q8, that moved a token's logits by up to ~2 between steps).

constexpr int64_t kMaxHeadDim = 256;

// 8 cache values as float32 (`load8` above for a float32 cache): a float16 cache's widened
// (exactly). A float16 cache halves the bytes attention reads (llama.cpp's default cache).
inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// n (a multiple of 8) float32 values into cache rows: copied, or rounded to the nearest
// float16 (ties to even, as torch's .to(torch.float16)).
inline void store_row(float* dst, const float* src, int64_t n) { std::copy_n(src, n, dst); }
inline void store_row(at::Half* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
}

// f(keys, values) with the cache's element pointers: at::Half* for a float16 cache, else
// float* (the callers checked that key and value share a dtype, one of the two).
template <typename F>
void with_cache(const at::Tensor& key, const at::Tensor& value, F&& f) {
  if (key.scalar_type() == at::kHalf) {
    f(key.data_ptr<at::Half>(), value.data_ptr<at::Half>());
  } else {
    f(key.data_ptr<float>(), value.data_ptr<float>());
  }
}

// exp(x) for x <= 0: Cephes' expf polynomial (about 1 ulp), exactly 0 below -87.3 (and for
// -inf), so masked keys weigh nothing.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n for the live lanes (n >= -126: a normal number); the others are masked to 0.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}

// Lane j of the result: the sum of v[j]'s 8 lanes, as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
inline __m256 lane_sums8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));  // [v0..v3 of l0-3 | of l4-7]
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Keys of one block of scores: 8 at a time, each a chain of D/8 FMAs then `lane_sums8`
// (8 independent chains: one key's chain alone was latency-bound).
constexpr int64_t kKeys = 8;
// Values summed per pass over a unit's queries: 16 rows of 64 floats stay in L1 for all.
constexpr int64_t kValueChunk = 16;
// Keys (and value rows) ahead of those in use that a unit asks the memory for. A unit's
// keys, then its values, are a short stream (128 bytes a row in float16) that the hardware
// prefetcher took up late: attention read a step's cache at a third of the bandwidth the
// products reach, and with the rows asked for 16 ahead a one-token step over a 1,000-token
// cache took 0.93-0.95 of the time (32 or 64 ahead: no better; docs/runner.md).
constexpr int64_t kRowsAhead = 16;

// Asks for rows [w0, w1) of a cache whose rows are `ld` elements apart, D elements each.
template <typename T>
inline void prefetch_rows(const T* base, int64_t ld, int64_t D, int64_t w0, int64_t w1) {
  for (int64_t w = w0; w < w1; ++w) {
    const char* row = reinterpret_cast<const char*>(base + w * ld);
    for (int64_t b = 0; b < D * int64_t(sizeof(T)); b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}

// Several query rows (`nq`: rows and heads) against one KV head: out[u][D] =
// softmax_w(q[u] . k[w] * scaling + mask[u][w]) . v[w] over w < W. A block of keys and a
// chunk of values are read from L2 once for all of the unit's queries (a query alone
// streamed its head's keys and values from L2 for each of the heads sharing them: about
// 25 cycles a key). Each (query, key) is still the same instructions whatever the other
// queries, the unit's size and the window past the keys its mask lets through: its score a
// chain of FMAs over D then `lane_sums8`, then fma(score, scaling, mask) (a block past W
// repeats the last key and drops those lanes); the output summed over the seen keys in key
// order. `scores`: room for nq * (W rounded up to 8); `acc`: nq * D floats.
template <int64_t kVecs, typename T>  // D / 8, or 0: any D (the head size as a constant keeps sums in registers); T: the cache's float or at::Half
void attend_unit(const float* const* qs, int64_t nq, const T* k, const T* v, int64_t ldk, int64_t ldv,
                 const float* const* masks, int64_t W, int64_t D, float scaling, float* scores, float* acc,
                 float* const* outs) {
  const int64_t vecs = kVecs ? kVecs : D / 8, padded = (W + kKeys - 1) / kKeys * kKeys;
  const __m256 scale = _mm256_set1_ps(scaling);
  for (int64_t w0 = 0; w0 < W; w0 += kKeys) {
    prefetch_rows(k, ldk, D, std::min(w0 + kRowsAhead, W), std::min(w0 + kRowsAhead + kKeys, W));
    const T* kw[kKeys];
    for (int64_t j = 0; j < kKeys; ++j) kw[j] = k + std::min(w0 + j, W - 1) * ldk;
    for (int64_t u = 0; u < nq; ++u) {
      const float* q = qs[u];
      __m256 dot[kKeys];
      const __m256 q0 = _mm256_loadu_ps(q);
      for (int64_t j = 0; j < kKeys; ++j) dot[j] = _mm256_mul_ps(q0, load8(kw[j]));
      for (int64_t i = 1; i < vecs; ++i) {
        const __m256 qi = _mm256_loadu_ps(q + 8 * i);
        for (int64_t j = 0; j < kKeys; ++j) dot[j] = _mm256_fmadd_ps(qi, load8(kw[j] + 8 * i), dot[j]);
      }
      __m256 m;
      if (w0 + kKeys <= W) {
        m = _mm256_loadu_ps(masks[u] + w0);
      } else {  // the lanes past W weigh 0
        alignas(32) float tail[kKeys];
        for (int64_t j = 0; j < kKeys; ++j) tail[j] = w0 + j < W ? masks[u][w0 + j] : -INFINITY;
        m = _mm256_load_ps(tail);
      }
      _mm256_storeu_ps(scores + u * padded + w0, _mm256_fmadd_ps(lane_sums8(dot), scale, m));
    }
  }
  std::vector<float> totals(nq, 0.0f);
  for (int64_t u = 0; u < nq; ++u) {  // softmax numerators: exp(score - the row's best)
    float* su = scores + u * padded;
    __m256 top = _mm256_loadu_ps(su);
    for (int64_t w = kKeys; w < padded; w += kKeys) top = _mm256_max_ps(top, _mm256_loadu_ps(su + w));
    alignas(32) float tops[8];
    _mm256_store_ps(tops, top);
    const __m256 best = _mm256_set1_ps(*std::max_element(tops, tops + 8));
    for (int64_t w = 0; w < padded; w += 8) _mm256_storeu_ps(su + w, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(su + w), best)));
  }
  std::fill(acc, acc + nq * D, 0.0f);
  for (int64_t w0 = 0; w0 < W; w0 += kValueChunk) {
    const int64_t w1 = std::min(w0 + kValueChunk, W);
    prefetch_rows(v, ldv, D, std::min(w0 + kRowsAhead, W), std::min(w1 + kRowsAhead, W));
    for (int64_t u = 0; u < nq; ++u) {
      const float* su = scores + u * padded;
      float* au = acc + u * D;
      __m256 o[kMaxHeadDim / 8];
      for (int64_t i = 0; i < vecs; ++i) o[i] = _mm256_loadu_ps(au + 8 * i);
      float total = totals[u];
      for (int64_t w = w0; w < w1; ++w) {
        if (su[w] == 0.0f) continue;  // a masked key (or one too far below the best to count)
        total += su[w];
        const __m256 p = _mm256_set1_ps(su[w]);
        const T* vw = v + w * ldv;
        for (int64_t i = 0; i < vecs; ++i) o[i] = _mm256_fmadd_ps(p, load8(vw + 8 * i), o[i]);
      }
      totals[u] = total;
      for (int64_t i = 0; i < vecs; ++i) _mm256_storeu_ps(au + 8 * i, o[i]);
    }
  }
  for (int64_t u = 0; u < nq; ++u) {
    const __m256 inv = _mm256_set1_ps(1.0f / totals[u]);
    for (int64_t i = 0; i < vecs; ++i) _mm256_storeu_ps(outs[u] + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(acc + u * D + 8 * i), inv));
  }
}

// Attention of R rows' H heads over one sequence's keys and values (H_kv heads, W keys
// each, head dimension D): `query(h, r)`, `mask(h, r)` and `output(h, r)` give each query's
// pointers (its D values, its W mask entries, its D outputs).
template <typename T, typename Query, typename Mask, typename Output>
void attend_heads(int64_t H, int64_t Hkv, int64_t R, int64_t D, int64_t W, float scale, const T* k, const T* v,
                  int64_t k_head, int64_t v_head, int64_t ldk, int64_t ldv, Query query, Mask mask, Output output) {
  const int64_t groups = H / Hkv, per_kv = groups * R;
  // Units: a KV head's queries (its heads' rows) in chunks of equal size, about 2 units
  // per thread (a chunk only changes which queries share the loads, never a query's
  // arithmetic). Unequal chunks (36 and 12 queries at 16 rows of SmolLM2's 3 KV heads)
  // left one of 2 threads idle for a fifth of the attention.
  const int64_t most = std::max<int64_t>(1, std::min(per_kv, Hkv * per_kv / (2 * at::get_num_threads())));
  const int64_t chunks = (per_kv + most - 1) / most;
  const int64_t chunk = (per_kv + chunks - 1) / chunks;
  const auto attend = D == 64 ? attend_unit<8, T> : D == 128 ? attend_unit<16, T> : attend_unit<0, T>;
  at::parallel_for(0, Hkv * chunks, 1, [&](int64_t c0, int64_t c1) {
    const int64_t padded = (W + kKeys - 1) / kKeys * kKeys;
    std::vector<float> scores(chunk * padded), acc(chunk * D);
    std::vector<const float*> qs(chunk), masks(chunk);
    std::vector<float*> outs(chunk);
    for (int64_t c = c0; c < c1; ++c) {  // c: (kv head, chunk of its queries)
      const int64_t kvh = c / chunks, first = c % chunks * chunk;
      const int64_t nq = std::min(chunk, per_kv - first);
      for (int64_t i = 0; i < nq; ++i) {  // query g * R + r of this KV head: head kvh * groups + g, row r
        const int64_t h = kvh * groups + (first + i) / R, r = (first + i) % R;
        qs[i] = query(h, r);
        masks[i] = mask(h, r);
        outs[i] = output(h, r);
      }
      attend(qs.data(), nq, k + kvh * k_head, v + kvh * v_head, ldk, ldv, masks.data(), W, D, scale, scores.data(),
             acc.data(), outs.data());
    }
  });
}

// query [B, H, R, D] float32, key and value [B, H_kv, W, D] (both float32 or both float16,
// each row contiguous), an additive float32 mask [B, 1 or H, R, W] -> output [B, R, H, D]
// float32.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask_in, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask_in.dim() == 4, "attention: query, key, value and mask must be 4-D");
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && value.device().is_cpu() && mask_in.device().is_cpu() &&
              query.scalar_type() == at::kFloat && mask_in.scalar_type() == at::kFloat &&
              (key.scalar_type() == at::kFloat || key.scalar_type() == at::kHalf) && value.scalar_type() == key.scalar_type(),
              "attention: query and mask must be float32, key and value both float32 or both float16, on a CPU");
  const int64_t B = query.size(0), H = query.size(1), R = query.size(2), D = query.size(3), Hkv = key.size(1), W = key.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= kMaxHeadDim && Hkv > 0 && H % Hkv == 0 && key.size(0) == B && key.size(3) == D && value.sizes() == key.sizes() && W > 0,
              "attention: shapes do not match: query ", query.sizes(), ", key ", key.sizes(), ", value ", value.sizes());
  TORCH_CHECK(mask_in.size(0) == B && (mask_in.size(1) == 1 || mask_in.size(1) == H) && mask_in.size(2) == R && mask_in.size(3) == W,
              "attention: the mask ", mask_in.sizes(), " does not match query ", query.sizes(), " and key ", key.sizes());
  const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
  const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
  const at::Tensor mask = mask_in.stride(3) == 1 ? mask_in : mask_in.contiguous();
  at::Tensor out = at::empty({B, R, H, D}, q.options());
  const int64_t mask_heads = mask.size(1);
  with_cache(k, v, [&](auto* kp, auto* vp) {
    for (int64_t b = 0; b < B; ++b) {
      const float* qb = q.data_ptr<float>() + b * q.stride(0);
      const float* mb = mask.data_ptr<float>() + b * mask.stride(0);
      float* ob = out.data_ptr<float>() + b * R * H * D;
      attend_heads(
          H, Hkv, R, D, W, static_cast<float>(scaling), kp + b * k.stride(0), vp + b * v.stride(0),
          k.stride(1), v.stride(1), k.stride(2), v.stride(2),
          [&](int64_t h, int64_t r) { return qb + h * q.stride(1) + r * q.stride(2); },
          [&](int64_t h, int64_t r) { return mb + (mask_heads == 1 ? 0 : h) * mask.stride(1) + r * mask.stride(2); },
          [&](int64_t h, int64_t r) { return ob + (r * H + h) * D; });
    }
  });
  return out;
}

// ---- a whole decoding step of a Llama decoder on these kernels (engine/native.py).
// The compiled step spent most of its own time in Python between kernels: per layer 5
// custom-op calls, ~15 views and ~13 allocations (docs/runner.md). Here the step is one
// call: the token rows' embeddings, every decoder layer (RMSNorm, the q/k/v product, RoPE,
// the cache write, attention, the output product and residual, RMSNorm, the gate/up
// product, SiLU times up, the down product and residual), the final norm and the int8
// head, with transformers' LlamaDecoderLayer's arithmetic. Every row is computed by the
// same instructions whatever the other rows: a verifying step's rows equal one-token steps
// bit for bit, as the products and the attention above promise for themselves.

// A Llama decoder's weights as these ops take them, held once per model.
// Where a layer's four products (q/k/v, o, gate/up, down) sit among its 6 tensors.
constexpr int kProductSlot[4] = {1, 2, 4, 5};

struct LlamaWeights : torch::CustomClassHolder {
  // Per layer, 6 tensors: input norm [E], q/k/v records [(Q + 2 KV)/16, E/32, 320], o
  // records [E/16, Q/32, 320], post-attention norm [E], gate/up records [2I/16, E/32, 320],
  // down records [E/16, I/32, 320]; each of the four products either such q4q8 records or
  // int8 codes [n/16, k/32, 512] (q8q8: `quant.Q8Records`), their scales in `product_scales`.
  std::vector<at::Tensor> layers;
  // Empty (every product q4q8 records), or per layer four tensors (q/k/v, o, gate/up,
  // down): an int8 product's float16 scales [n/16, k/32, 16], or an empty tensor where
  // that product is q4q8 records (a GGUF file mixing 4-bit and wider blocks).
  std::vector<at::Tensor> product_scales;
  at::Tensor embed;       // [V_in, E] float32
  at::Tensor final_norm;  // [E]
  at::Tensor smooth;      // [E]: the head's inputs are multiplied by it (quant.smoothed_int8); empty: by 1
  at::Tensor codes;       // the head's weights: int8 codes packed as q8q8_mm takes them, or float32 [V, E] (then no scales)
  at::Tensor scales;      // [V] float32 for int8 codes; empty for float32 weights
  std::vector<int64_t> cache_layer;  // each layer's (keys, values) in the cache lists
  int64_t heads, kv_heads, head_dim, inter;
  double eps, scaling;
  // The KV cache the steps write and read (`set_cache`): one [1, H_kv, C, D] pair per cache
  // layer, float32 or float16 (the new rows rounded to it as they are written). Held here
  // rather than passed per step: a step's arguments stay few (torch's Python dispatch
  // scans every argument of an op that takes a class, per call).
  std::vector<at::Tensor> keys, values;

  LlamaWeights(std::vector<at::Tensor> layers_, std::vector<at::Tensor> product_scales_, at::Tensor embed_, at::Tensor final_norm_,
               at::Tensor smooth_, at::Tensor codes_, at::Tensor scales_, std::vector<int64_t> cache_layer_, std::vector<int64_t> dims,
               double eps_, double scaling_)
      : layers(std::move(layers_)), product_scales(std::move(product_scales_)), embed(std::move(embed_)), final_norm(std::move(final_norm_)), smooth(std::move(smooth_)),
        codes(std::move(codes_)), scales(std::move(scales_)), cache_layer(std::move(cache_layer_)), eps(eps_), scaling(scaling_) {
    TORCH_CHECK(dims.size() == 4, "LlamaWeights: dims are (heads, kv_heads, head_dim, intermediate)");
    heads = dims[0], kv_heads = dims[1], head_dim = dims[2], inter = dims[3];
    const int64_t L = static_cast<int64_t>(cache_layer.size()), E = embed.size(1);
    const int64_t Q = heads * head_dim, KV = kv_heads * head_dim;
    TORCH_CHECK(static_cast<int64_t>(layers.size()) == 6 * L && L > 0, "LlamaWeights: 6 tensors per layer");
    TORCH_CHECK(head_dim % 8 == 0 && head_dim <= kMaxHeadDim && head_dim % 2 == 0 && kv_heads > 0 && heads % kv_heads == 0,
                "LlamaWeights: unsupported heads");
    TORCH_CHECK(E % kGroup == 0 && Q % kGroup == 0 && inter % kGroup == 0 && (Q + 2 * KV) % kBlock == 0 && E % kBlock == 0 &&
                inter % kBlock == 0, "LlamaWeights: widths must be whole groups of 32 and blocks of 16");
    auto f32 = [](const at::Tensor& t, int64_t n, const char* what) {
      TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n && t.device().is_cpu(), "LlamaWeights: ", what,
                  " must be contiguous float32 with ", n, " values");
    };
    auto records = [](const at::Tensor& t, int64_t n, int64_t k, const char* what) {
      TORCH_CHECK(t.scalar_type() == at::kByte && t.is_contiguous() && t.dim() == 3 && t.size(0) == n / kBlock &&
                  t.size(1) == k / kGroup && t.size(2) == kRecord && t.device().is_cpu(), "LlamaWeights: ", what, " records ", t.sizes(),
                  " do not hold ", n, " x ", k, " weights");
    };
    TORCH_CHECK(product_scales.empty() || static_cast<int64_t>(product_scales.size()) == 4 * L,
                "LlamaWeights: no scales, or 4 per layer");
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor* t = layers.data() + 6 * l;
      f32(t[0], E, "an input norm");
      f32(t[3], E, "a post-attention norm");
      const int64_t shapes[4][2] = {{Q + 2 * KV, E}, {E, Q}, {2 * inter, E}, {E, inter}};  // (n, k)
      const char* names[4] = {"q/k/v", "o", "gate/up", "down"};
      for (int j = 0; j < 4; ++j) {
        if (int8_product(l, j)) {
          check_q8_blocks(t[kProductSlot[j]], product_scales[4 * l + j], shapes[j][0], shapes[j][1], names[j]);
        } else {
          records(t[kProductSlot[j]], shapes[j][0], shapes[j][1], names[j]);
        }
      }
    }
    TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == at::kFloat && embed.is_contiguous(), "LlamaWeights: embed must be contiguous float32 [V, E]");
    f32(final_norm, E, "the final norm");
    if (smooth.numel()) f32(smooth, E, "the head's smoothing");
    if (codes.scalar_type() == at::kChar) {
      check_head(at::empty({0, E}), codes, scales, "LlamaWeights' head");
    } else {
      TORCH_CHECK(codes.dim() == 2 && codes.size(1) == E && codes.size(0) > 0 && codes.scalar_type() == at::kFloat && codes.is_contiguous() &&
                  codes.device().is_cpu(), "LlamaWeights: the head must be packed int8 codes or contiguous float32 [V, E]");
      TORCH_CHECK(scales.numel() == 0, "LlamaWeights: a float32 head has no scales");
    }
  }

  // Whether product j (0 q/k/v, 1 o, 2 gate/up, 3 down) of layer l is int8 codes, not q4q8 records.
  bool int8_product(int64_t l, int j) const { return !product_scales.empty() && product_scales[4 * l + j].numel() > 0; }

  void set_cache(std::vector<at::Tensor> keys_, std::vector<at::Tensor> values_) {
    TORCH_CHECK(keys_.size() == values_.size() && !keys_.empty(), "set_cache: one (keys, values) pair per cache layer");
    for (int64_t l : cache_layer) {
      TORCH_CHECK(l >= 0 && l < static_cast<int64_t>(keys_.size()), "set_cache: no cache layer ", l, " among ", keys_.size());
    }
    const int64_t C = keys_[0].dim() == 4 ? keys_[0].size(2) : -1;
    const at::ScalarType dtype = keys_[0].scalar_type();
    for (size_t i = 0; i < keys_.size(); ++i) {
      for (const at::Tensor* t : {&keys_[i], &values_[i]}) {
        TORCH_CHECK(t->dim() == 4 && t->size(0) == 1 && t->size(1) == kv_heads && t->size(2) == C && t->size(3) == head_dim &&
                    (dtype == at::kFloat || dtype == at::kHalf) && t->scalar_type() == dtype && t->is_contiguous() && t->device().is_cpu(),
                    "set_cache: cache buffers must be contiguous [1, H_kv, C, D], all float32 or all float16, all of one capacity");
      }
    }
    keys = std::move(keys_);
    values = std::move(values_);
  }
};

// y = x * rsqrt(mean(x^2) + eps) * w over one row of E floats (transformers' LlamaRMSNorm
// in float32: the product by the reciprocal first, then by the weight).
inline void rms_norm(const float* x, const float* w, int64_t E, float eps, float* y) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < E; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(lane_sum(acc) / static_cast<float>(E) + eps);
  const __m256 r = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < E; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), r)));
}

// One head's D values rotated in place: x * cos + rotate_half(x) * sin (transformers'
// apply_rotary_pos_emb: rotate_half(x) = [-x2, x1] for the halves x1, x2).
inline void rope(float* x, const float* cos, const float* sin, int64_t D) {
  const int64_t half = D / 2;
  alignas(32) float rotated[kMaxHeadDim];
  for (int64_t i = 0; i < half; ++i) rotated[i] = -x[half + i], rotated[half + i] = x[i];
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(cos + i));
    const __m256 b = _mm256_mul_ps(_mm256_load_ps(rotated + i), _mm256_loadu_ps(sin + i));
    _mm256_storeu_ps(x + i, _mm256_add_ps(a, b));
  }
}

// out[i] = silu(gate[i]) * up[i], silu(g) = g * sigmoid(g), over n floats (n % 8 == 0).
inline void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign));  // exp(-|g|), in (0, 1]
    const __m256 sig_abs = _mm256_div_ps(one, _mm256_add_ps(one, e));  // sigmoid(|g|)
    // sigmoid(g) = sigmoid(|g|) for g >= 0, 1 - sigmoid(|g|) = e / (1 + e) otherwise
    const __m256 sig = _mm256_blendv_ps(sig_abs, _mm256_mul_ps(e, sig_abs), _mm256_cmp_ps(g, zero, _CMP_LT_OQ));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
}

// Logits [n, V] of final-normed rows [n, E] (contiguous): the smoothing (on a copy), then
// the head's product, as `quant.Int8F32Head` multiplies (or a float32 head's rows).
at::Tensor head_logits(const LlamaWeights& w, const at::Tensor& normed) {
  if (w.codes.scalar_type() == at::kFloat) return product<float>(normed, w.codes, nullptr);
  at::Tensor in = normed;
  if (w.smooth.numel()) {
    const int64_t n = normed.size(0), E = normed.size(1);
    in = at::empty({n, E}, normed.options());
    const float* sm = w.smooth.data_ptr<float>();
    const float* src = normed.data_ptr<float>();
    float* dst = in.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < E; ++i) dst[r * E + i] = src[r * E + i] * sm[i];
    }
  }
  return q8q8_mm(in, w.codes, w.scales);
}

// One step of R new tokens: ids [R] (int64), RoPE tables cos and sin [P, D] (rows by
// position), positions [R] (each row's position, < P), mask [1, 1, R, W] (additive, over
// the first W cache rows), the rows written at cache rows start..start+R-1 of every
// layer's keys and values (`LlamaWeights::set_cache`; start + R <= W <= C). A chain (row r
// after every cached row and the new rows before it: plain decoding, a drafted sequence)
// may come as empty positions and mask and its `window` W: positions start + r, and the
// mask `runner.step_mask` builds for it, here (a cold step's Python pays ~0.1 ms for its
// torch calls after the weights' stream). Returns logits [R, V],
// or with `logit_rows` > 0 those of the last logit_rows rows only (a prefill's chunk wants
// one row's, and the head is the largest product: 28 MB for SmolLM2-135M's 49,152 words),
// or with `logit_rows` -1 the final-normed rows [R, E], for `llama_head` to finish;
// `states`, if given ([L + 1, R, E]), gets transformers' hidden states: the embeddings,
// each layer's output but the last, the final norm's output.
at::Tensor llama_step(const c10::intrusive_ptr<LlamaWeights>& w, const at::Tensor& ids, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& positions_in, const at::Tensor& mask_in, int64_t start, const std::optional<at::Tensor>& states,
                      int64_t logit_rows, int64_t window) {
  const int64_t L = static_cast<int64_t>(w->cache_layer.size()), E = w->embed.size(1), V = w->embed.size(0);
  const int64_t H = w->heads, Hkv = w->kv_heads, D = w->head_dim, I = w->inter, Q = H * D, KV = Hkv * D, QKV = Q + 2 * KV;
  const int64_t R = ids.numel();
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous() && R > 0, "llama_step: ids must be int64 [R]");
  // The rows whose logits are wanted: the last logit_rows (a prefill wants its last row's),
  // 0: every row; -1: none, the final-normed rows [R, E] are returned instead.
  TORCH_CHECK(logit_rows >= -1, "llama_step: logit_rows must be >= -1 (0: every row, -1: no head), got ", logit_rows);
  const int64_t first_logit = logit_rows > 0 ? R - std::min(logit_rows, R) : 0;
  // A chain without positions and mask: start + r, and 0 over cache rows 0..start+r with the
  // float's lowest beyond (what `runner.step_mask` writes: the same bits as one handed in).
  const bool chain = positions_in.numel() == 0 && mask_in.numel() == 0;  // its window W: checked below as a mask's
  if (!chain) {
    TORCH_CHECK(positions_in.dim() == 1 && positions_in.numel() == R && positions_in.scalar_type() == at::kLong &&
                positions_in.is_contiguous(), "llama_step: positions must be int64 [R]");
    TORCH_CHECK(mask_in.dim() == 4 && mask_in.size(0) == 1 && mask_in.size(1) == 1 && mask_in.size(2) == R &&
                mask_in.scalar_type() == at::kFloat && mask_in.is_contiguous(), "llama_step: mask must be contiguous float32 [1, 1, R, W]");
  }
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == D && cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.sizes() == cos.sizes() &&
              sin.scalar_type() == at::kFloat && sin.is_contiguous(), "llama_step: cos and sin must be contiguous float32 [P, D]");
  const int64_t W = chain ? window : mask_in.size(3), P = cos.size(0);
  const std::vector<at::Tensor>& keys = w->keys;
  const std::vector<at::Tensor>& values = w->values;
  TORCH_CHECK(!keys.empty(), "llama_step: no cache set (LlamaWeights.set_cache)");
  const int64_t C = keys[0].size(2);
  TORCH_CHECK(start >= 0 && start + R <= W && W <= C, "llama_step: rows ", start, "..", start + R, " do not fit a window of ", W,
              " in a cache of ", C);
  std::vector<int64_t> chain_pos(chain ? R : 0);
  std::vector<float> chain_mask(chain ? R * W : 0, std::numeric_limits<float>::lowest());
  for (int64_t r = 0; r < (chain ? R : 0); ++r) {
    chain_pos[r] = start + r;
    std::fill_n(chain_mask.data() + r * W, start + r + 1, 0.0f);
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* pos = chain ? chain_pos.data() : positions_in.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < V, "llama_step: token id ", id[r], " is outside the vocabulary of ", V);
    TORCH_CHECK(pos[r] >= 0 && pos[r] < P, "llama_step: position ", pos[r], " is outside the RoPE table of ", P);
  }
  float* st = nullptr;
  if (states.has_value()) {
    TORCH_CHECK(states->dim() == 3 && states->size(0) == L + 1 && states->size(1) == R && states->size(2) == E &&
                states->scalar_type() == at::kFloat && states->is_contiguous(), "llama_step: states must be contiguous float32 [L + 1, R, E]");
    st = states->data_ptr<float>();
  }
  // Scratch: the residual stream x, a normed copy, q/k/v, attention's output, a product's
  // output, gate/up and their SiLU product; the int8 groups of the widest input.
  const int64_t widest = std::max({E, Q, I});
  std::vector<float> x(R * E), xn(R * E), qkv(R * QKV), att(R * Q), tmp(R * E), gu(R * 2 * I), act(R * I);
  std::vector<int8_t> qx(R * widest);
  std::vector<float> dsx(2 * R * (widest / kGroup));
  float* dx = dsx.data();
  float* sx = dx + R * (widest / kGroup);
  std::vector<int32_t> cx(w->product_scales.empty() ? 0 : R * (widest / kGroup));
  // Product j (0 q/k/v, 1 o, 2 gate/up, 3 down) of layer l: R rows of `in` (K wide) -> n outputs.
  auto layer_product = [&](int64_t l, int j, const float* in, int64_t K, int64_t n, float* out) {
    const at::Tensor& wt = w->layers[6 * l + kProductSlot[j]];
    if (!w->int8_product(l, j)) {
      q4q8_rows(in, K, R, K, wt.data_ptr<uint8_t>(), n, out, n, qx.data(), dx, sx);
    } else {
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(w->product_scales[4 * l + j].data_ptr<at::Half>());
      q8q8_block_rows(in, K, R, K, wt.data_ptr<int8_t>(), ws, n, out, n, qx.data(), dx, sx, cx.data());
    }
  };
  const float eps = static_cast<float>(w->eps);
  const float* mp = chain ? chain_mask.data() : mask_in.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) std::copy_n(w->embed.data_ptr<float>() + id[r] * E, E, x.data() + r * E);
  if (st) std::copy(x.begin(), x.end(), st);
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* t = w->layers.data() + 6 * l;
    const int64_t cl = w->cache_layer[l];  // within keys: set_cache checked it
    each_row(R, [&](int64_t r) { rms_norm(x.data() + r * E, t[0].data_ptr<float>(), E, eps, xn.data() + r * E); });
    layer_product(l, 0, xn.data(), E, QKV, qkv.data());
    each_row(R, [&](int64_t r) {
      float* row = qkv.data() + r * QKV;
      const float* c = cos.data_ptr<float>() + pos[r] * D;
      const float* s = sin.data_ptr<float>() + pos[r] * D;
      for (int64_t h = 0; h < H + Hkv; ++h) rope(row + h * D, c, s, D);  // the q heads, then the k heads
    });
    with_cache(keys[cl], values[cl], [&](auto* kc, auto* vc) {
      for (int64_t r = 0; r < R; ++r) {
        const float* row = qkv.data() + r * QKV;
        for (int64_t h = 0; h < Hkv; ++h) {  // the new keys and values into the cache
          store_row(kc + (h * C + start + r) * D, row + Q + h * D, D);
          store_row(vc + (h * C + start + r) * D, row + Q + KV + h * D, D);
        }
      }
      attend_heads(
          H, Hkv, R, D, W, static_cast<float>(w->scaling), kc, vc, C * D, C * D, D, D,
          [&](int64_t h, int64_t r) { return qkv.data() + r * QKV + h * D; },
          [&](int64_t, int64_t r) { return mp + r * W; },
          [&](int64_t h, int64_t r) { return att.data() + r * Q + h * D; });
    });
    layer_product(l, 1, att.data(), Q, E, tmp.data());
    each_row(R, [&](int64_t r) {
      for (int64_t i = r * E; i < (r + 1) * E; ++i) x[i] += tmp[i];
      rms_norm(x.data() + r * E, t[3].data_ptr<float>(), E, eps, xn.data() + r * E);
    });
    layer_product(l, 2, xn.data(), E, 2 * I, gu.data());
    each_row(R, [&](int64_t r) { silu_mul(gu.data() + r * 2 * I, gu.data() + r * 2 * I + I, act.data() + r * I, I); });
    layer_product(l, 3, act.data(), I, E, tmp.data());
    for (int64_t i = 0; i < R * E; ++i) x[i] += tmp[i];
    if (st && l + 1 < L) std::copy(x.begin(), x.end(), st + (l + 1) * R * E);
  }
  at::Tensor normed = at::empty({R, E}, ids.options().dtype(at::kFloat));
  float* np = normed.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) rms_norm(x.data() + r * E, w->final_norm.data_ptr<float>(), E, eps, np + r * E);
  if (st) std::copy_n(np, R * E, st + L * R * E);
  if (logit_rows < 0) return normed;  // no head: the caller takes the rows it reads (`llama_head`)
  return head_logits(*w, normed.narrow(0, first_logit, R - first_logit));  // contiguous: whole rows
}

// The head's logits [n, V] of final-normed rows [n, E] (float32, contiguous): what
// `llama_step` ends with, for rows a caller reads after the step (verification reads the
// rows of its walk only; each row's logits are the same bits whatever rows come with it).
at::Tensor llama_head(const c10::intrusive_ptr<LlamaWeights>& w, const at::Tensor& normed) {
  TORCH_CHECK(normed.dim() == 2 && normed.size(1) == w->embed.size(1) && normed.scalar_type() == at::kFloat && normed.device().is_cpu(),
              "llama_head: rows must be float32 [n, ", w->embed.size(1), "], got ", normed.sizes());
  return head_logits(*w, normed.contiguous());
}

}  // namespace

TORCH_LIBRARY(pardec_avx2, m) {
  m.def("f32_mm(Tensor x, Tensor w) -> Tensor");
  m.def("q8f32_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("q4q8_mm(Tensor x, Tensor w, int n) -> Tensor");
  m.def("q8q8_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("q8q8_blocks_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scaling) -> Tensor");
  // Rows q4q8_mm multiplies per pass over a block's weights (this build's; `quant.row_tile`).
  m.def("q4q8_row_tile() -> int", []() -> int64_t { return kMaxRows; });
  m.class_<LlamaWeights>("LlamaWeights")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                       std::vector<int64_t>, std::vector<int64_t>, double, double>())
      .def("set_cache", &LlamaWeights::set_cache);
  m.def("llama_step(__torch__.torch.classes.pardec_avx2.LlamaWeights weights, Tensor ids, Tensor cos, Tensor sin, Tensor positions, "
        "Tensor mask, int start, Tensor? states, int logit_rows=0, int window=0) -> Tensor");
  m.def("llama_head(__torch__.torch.classes.pardec_avx2.LlamaWeights weights, Tensor normed) -> Tensor");
}
TORCH_LIBRARY_IMPL(pardec_avx2, CPU, m) {
  m.impl("f32_mm", &f32_mm);
  m.impl("q8f32_mm", &q8f32_mm);
  m.impl("q4q8_mm", &q4q8_mm);
  m.impl("q8q8_mm", &q8q8_mm);
  m.impl("q8q8_blocks_mm", &q8q8_blocks_mm);
  m.impl("attention", &attention);
  m.impl("llama_step", &llama_step);
  m.impl("llama_head", &llama_head);
}

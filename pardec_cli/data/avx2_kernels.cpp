// pardec's products for float32 activations on CPUs with AVX2 and FMA (no AVX512 needed):
//   pardec_avx2::f32_mm  float32 weights w [N, K] (an nn.Linear's own, not copied):
//                        dense layers and the output head in float32;
//   pardec_avx2::q8f32_mm  int8 weights q [N, K] with one float32 scale per output
//                        (`quant.Int8Linear`'s own): y = (x @ q.T) * scale;
//   pardec_avx2::q4q8_mm  4-bit weights in `quant.Int4Records`' layout (GGUF Q4_1's
//                        w = q * d + m) by activations quantized to int8 in groups of 32,
//                        as llama.cpp multiplies Q4_1 by Q8_1: --weights q4q8 on AVX2;
//   pardec_avx2::attention  a few query rows' attention over a float32 cache, each row
//                        computed alone (engine/attention.py).
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kOut = 4;  // outputs per block

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

// The weights `kAhead` rows on from w + k into L1, once per 64-byte line: the next blocks'
// rows (int8 weights read 8.5 instead of 13 ms per SmolLM2-135M step with them).
template <typename T>
inline void prefetch_ahead(const T* const* w, int64_t k, int64_t K) {
  constexpr int64_t kAhead = sizeof(T) == 1 ? 8 : 4;
  if ((k * static_cast<int64_t>(sizeof(T))) % 64 != 0) return;
  for (int64_t j = 0; j < kOut; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + k + kAhead * K), _MM_HINT_T0);
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
// Rows per pass over a block's records (4 beat 1, 2 and 8 at 8-16 rows, same at 1-2); the
// records 32 ahead (10 KB) are prefetched (8 to 64 ahead measured alike within noise).
constexpr int64_t kMaxRows = 4, kPrefetch = 32 * kRecord;

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

// R rows (codes qx [R, K], d_x and s_x [R, G]) by one block's G records -> out [R, 16].
template <int R>
void q4_block_rows(const int8_t* qx, const float* dx, const float* sx, int64_t K, int64_t G, const uint8_t* w, float* out,
                   int64_t ldo) {
  __m256 acc0[R], acc1[R];  // outputs 0-7 and 8-15
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = w + g * kRecord;
    for (int64_t line = 0; line < kRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + line), _MM_HINT_T0);
    __m256i dot0[R], dot1[R];  // int16 pair sums
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
        dot0[r] = _mm256_add_epi16(dot0[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo0, va), _mm256_maddubs_epi16(hi0, vb)));
        dot1[r] = _mm256_add_epi16(dot1[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo1, va), _mm256_maddubs_epi16(hi1, vb)));
      }
    }
    const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 256)));
    const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 272)));
    const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 288)));
    const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 304)));
    for (int r = 0; r < R; ++r) {
      const __m256 ddx = _mm256_set1_ps(dx[r * G + g]), s = _mm256_set1_ps(sx[r * G + g]);
      acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(dot0[r], ones)), _mm256_mul_ps(d0, ddx), acc0[r]);
      acc0[r] = _mm256_fmadd_ps(m0, s, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(dot1[r], ones)), _mm256_mul_ps(d1, ddx), acc1[r]);
      acc1[r] = _mm256_fmadd_ps(m1, s, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * ldo, acc0[r]);
    _mm256_storeu_ps(out + r * ldo + 8, acc1[r]);
  }
}

using Q4BlockRows = void (*)(const int8_t*, const float*, const float*, int64_t, int64_t, const uint8_t*, float*, int64_t);
constexpr Q4BlockRows kQ4BlockRows[kMaxRows + 1] = {nullptr, q4_block_rows<1>, q4_block_rows<2>, q4_block_rows<3>, q4_block_rows<4>};

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
  const float* xp = x.data_ptr<float>();
  int8_t* qp = qx.data_ptr<int8_t>();
  float* dp = scales.data_ptr<float>();
  float* sp = dp + M * G;
  for (int64_t i = 0; i < M * G; ++i) quantize_group(xp + i * kGroup, qp + i * kGroup, dp + i, sp + i);
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t r0 = 0; r0 < M; r0 += kMaxRows) {
        kQ4BlockRows[std::min(kMaxRows, M - r0)](qp + r0 * K, dp + r0 * G, sp + r0 * G, K, G, wp + nb * G * kRecord,
                                                 op + r0 * n + nb * kBlock, n);
      }
    }
  });
  return out;
}

// ---- attention of a few query rows over a float32 cache. As pardec_q4::attention (AVX512,
// bfloat16): every (row, head) is computed by the same instructions whatever the other rows
// and however many keys the window holds beyond the ones its mask lets through: each key's
// score alone, softmax in float32 with an exact zero for masked keys, its sum and the output
// summed over the seen keys in key order. A token's attention is then the same bits in a
// decoding step and in any verifying step (SDPA's were not: with activations rounded to
// int8 by q4q8, that moved a token's logits by up to ~2 between steps).

constexpr int64_t kMaxHeadDim = 256;

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

// Several query rows (`nq`: rows and heads) against one KV head: out[u][D] =
// softmax_w(q[u] . k[w] * scaling + mask[u][w]) . v[w] over w < W. A block of keys and a
// chunk of values are read from L2 once for all of the unit's queries (a query alone
// streamed its head's keys and values from L2 for each of the heads sharing them: about
// 25 cycles a key). Each (query, key) is still the same instructions whatever the other
// queries, the unit's size and the window past the keys its mask lets through: its score a
// chain of FMAs over D then `lane_sums8`, then fma(score, scaling, mask) (a block past W
// repeats the last key and drops those lanes); the output summed over the seen keys in key
// order. `scores`: room for nq * (W rounded up to 8); `acc`: nq * D floats.
template <int64_t kVecs>  // D / 8, or 0: any D (the head size as a constant keeps sums in registers)
void attend_unit(const float* const* qs, int64_t nq, const float* k, const float* v, int64_t ldk, int64_t ldv,
                 const float* const* masks, int64_t W, int64_t D, float scaling, float* scores, float* acc,
                 float* const* outs) {
  const int64_t vecs = kVecs ? kVecs : D / 8, padded = (W + kKeys - 1) / kKeys * kKeys;
  const __m256 scale = _mm256_set1_ps(scaling);
  for (int64_t w0 = 0; w0 < W; w0 += kKeys) {
    const float* kw[kKeys];
    for (int64_t j = 0; j < kKeys; ++j) kw[j] = k + std::min(w0 + j, W - 1) * ldk;
    for (int64_t u = 0; u < nq; ++u) {
      const float* q = qs[u];
      __m256 dot[kKeys];
      const __m256 q0 = _mm256_loadu_ps(q);
      for (int64_t j = 0; j < kKeys; ++j) dot[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(kw[j]));
      for (int64_t i = 1; i < vecs; ++i) {
        const __m256 qi = _mm256_loadu_ps(q + 8 * i);
        for (int64_t j = 0; j < kKeys; ++j) dot[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(kw[j] + 8 * i), dot[j]);
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
        const float* vw = v + w * ldv;
        for (int64_t i = 0; i < vecs; ++i) o[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vw + 8 * i), o[i]);
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

// query [B, H, R, D], key and value [B, H_kv, W, D] (float32, each row contiguous), an
// additive float32 mask [B, 1 or H, R, W] -> output [B, R, H, D] float32.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask_in, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask_in.dim() == 4, "attention: query, key, value and mask must be 4-D");
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && value.device().is_cpu() && mask_in.device().is_cpu() &&
              query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat && value.scalar_type() == at::kFloat &&
              mask_in.scalar_type() == at::kFloat, "attention: query, key, value and mask must be float32 on a CPU");
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
  const int64_t groups = H / Hkv, mask_heads = mask.size(1), per_kv = groups * R;
  const float scale = static_cast<float>(scaling);
  // Units: a KV head's queries (its heads' rows) in chunks, about 2 units per thread (a
  // chunk only changes which queries share the loads, never a query's arithmetic).
  const int64_t chunk = std::max<int64_t>(1, std::min(per_kv, B * Hkv * per_kv / (2 * at::get_num_threads())));
  const int64_t chunks = (per_kv + chunk - 1) / chunk;
  const auto attend = D == 64 ? attend_unit<8> : D == 128 ? attend_unit<16> : attend_unit<0>;
  at::parallel_for(0, B * Hkv * chunks, 1, [&](int64_t c0, int64_t c1) {
    const int64_t padded = (W + kKeys - 1) / kKeys * kKeys;
    std::vector<float> scores(chunk * padded), acc(chunk * D);
    std::vector<const float*> qs(chunk), masks(chunk);
    std::vector<float*> outs(chunk);
    for (int64_t c = c0; c < c1; ++c) {  // c: (batch, kv head, chunk of its queries)
      const int64_t b = c / (Hkv * chunks), kvh = c / chunks % Hkv, first = c % chunks * chunk;
      const int64_t nq = std::min(chunk, per_kv - first);
      for (int64_t i = 0; i < nq; ++i) {  // query g * R + r of this KV head: head kvh * groups + g, row r
        const int64_t h = kvh * groups + (first + i) / R, r = (first + i) % R;
        qs[i] = q.data_ptr<float>() + b * q.stride(0) + h * q.stride(1) + r * q.stride(2);
        masks[i] = mask.data_ptr<float>() + b * mask.stride(0) + (mask_heads == 1 ? 0 : h) * mask.stride(1) + r * mask.stride(2);
        outs[i] = out.data_ptr<float>() + ((b * R + r) * H + h) * D;
      }
      attend(qs.data(), nq, k.data_ptr<float>() + b * k.stride(0) + kvh * k.stride(1),
             v.data_ptr<float>() + b * v.stride(0) + kvh * v.stride(1), k.stride(2), v.stride(2), masks.data(), W, D,
             scale, scores.data(), acc.data(), outs.data());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(pardec_avx2, m) {
  m.def("f32_mm(Tensor x, Tensor w) -> Tensor");
  m.def("q8f32_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("q4q8_mm(Tensor x, Tensor w, int n) -> Tensor");
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scaling) -> Tensor");
}
TORCH_LIBRARY_IMPL(pardec_avx2, CPU, m) {
  m.impl("f32_mm", &f32_mm);
  m.impl("q8f32_mm", &q8f32_mm);
  m.impl("q4q8_mm", &q4q8_mm);
  m.impl("attention", &attention);
}

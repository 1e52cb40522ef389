// pardec's products of 4-bit weights (GGUF Q4_1's arithmetic) for CPUs with AVX512:
//   pardec_q4::q4bf16_mm  bfloat16 activations (AVX512-BF16 dot products), the int4
//                         layers' kernel: what torch's int4 kernel computes, faster;
//   pardec_q4::q4q8_mm    int8 activations (AVX512-VNNI), as llama.cpp multiplies Q4_1
//                         by Q8_1: faster still for a few rows, further from the full model.
//   pardec_q4::q8bf16_mm  int8 weights (one scale per output), bfloat16 activations
//                         (AVX512-BF16): --weights int8's layers in bfloat16;
//   pardec_q4::bf16_mm    bfloat16 weights and activations (AVX512-BF16): dense layers
//                         in bfloat16 on a CPU without AMX;
//   pardec_q4::attention  a few query rows' attention over a bfloat16 cache (AVX512-BF16),
//                         each row computed alone (engine/attention.py).
// Built at run time by torch.utils.cpp_extension (pardec_cli/kernels.py).
//
// Weights: uint8 [N/16, K/32, 320], one 320-byte record per block of 16 outputs and
// group of 32 inputs: 256 bytes of codes, then 16 f16 scales d, then 16 f16 minimums m,
// with w[n, k] = q[n, k] * d[n, g] + m[n, g]. Code bytes come in 4 chunks of 64: byte
// 4 * i + b of chunk p holds q[i, 8p + b] in its low nibble and q[i, 8p + 4 + b] in its
// high one, so that one VPDPBUSD multiplies 16 outputs' 4 consecutive codes by 4
// activation codes broadcast to every lane.
// q4q8: each row's groups of 32 activations quantized to int8 with d_x = max|x| / 127,
// and the group's float sum s_x kept for the minimums:
//   y[r, n] = sum_g d[n, g] d_x[r, g] sum_k q[n, k] q_x[r, k] + m[n, g] s_x[r, g].
// q4bf16: codes become the bfloat16 numbers 128 + q (a byte 0x43 above each code), one
// VDPBF16PS multiplies 8 outputs' 4 codes by 4 activations, and the 128 comes off with
// the minimums, in float32:
//   y[r, n] = sum_g d[n, g] sum_k (128 + q[n, k]) x[r, k] + (m[n, g] - 128 d[n, g]) s_x[r, g].
// Every row is computed by the same instructions whatever the number of rows, so a row's
// result does not depend on the rows around it.
// The tensor type and the one op used (at::empty), not <ATen/ATen.h>: every op's declarations
// took 11 of the build's 21 s on a 2-core AVX2 machine (now 7 of 15), and a first run waits for it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGroup = 32, kBlock = 16, kRecord = 320, kMaxRows = 8, kPrefetch = 64 * kRecord;

// Blocks of 16 outputs split over torch's threads, each block's rows in passes of at most
// `pass`: run(rows, r0, nb) computes rows r0 .. r0 + rows - 1 of block nb.
template <typename Run>
void over_blocks(int64_t M, int64_t NB, int64_t pass, const Run& run) {
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t r0 = 0; r0 < M; r0 += pass) run(std::min(pass, M - r0), r0, nb);
    }
  });
}

// 16 floats to bfloat16, rounded to nearest even (as torch rounds); no AVX512-BF16 needed.
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

inline __m512 from_bf16(const c10::BFloat16* x) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The lanes of `valid` from 16 bfloat16 at x (others 0, not read), as float32.
inline __m512 from_bf16(const c10::BFloat16* x, __mmask16 valid) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, x)), 16));
}

template <int R, typename Out>
__attribute__((target("avx512vnni"))) void block_rows(const int8_t* qx, const float* dx, const float* sx, int64_t K, int64_t G, const uint8_t* w,
                Out* out, int64_t ldo) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = w + g * kRecord;
    // 64 records (20 KB) ahead: with a few cores the hardware prefetcher alone reached
    // ~38 GB/s on a 44 MB product, 16 records ahead ~45; over a step's 120 products 64
    // ahead beat 16 by 8-10% (32 to 96: alike), on a 2-core AMD EPYC.
    for (int64_t line = 0; line < kRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + line), _MM_HINT_T0);
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(rec + 64 * p);
      const __m512i lo = _mm512_and_si512(v, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = qx + r * K + g * kGroup + 8 * p;
        int32_t xa, xb;
        __builtin_memcpy(&xa, x, 4);
        __builtin_memcpy(&xb, x + 4, 4);
        dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(xa));
        dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(xb));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 288)));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx[r * G + g])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[r * G + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (std::is_same_v<Out, float>) {
      _mm512_storeu_ps(out + r * ldo, acc[r]);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), to_bf16(acc[r]));
    }
  }
}

template <typename Out>
using BlockRows = void (*)(const int8_t*, const float*, const float*, int64_t, int64_t, const uint8_t*, Out*, int64_t);
template <typename Out>
constexpr BlockRows<Out> kBlockRows[kMaxRows + 1] = {nullptr, block_rows<1, Out>, block_rows<2, Out>, block_rows<3, Out>,
                                                     block_rows<4, Out>, block_rows<5, Out>, block_rows<6, Out>,
                                                     block_rows<7, Out>, block_rows<8, Out>};

// One group of 32 activations to int8: codes, scale d_x and the float sum s_x.
inline void quantize_group(__m512 a, __m512 b, int8_t* q, float* d_out, float* s_out) {
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(_mm512_cvt_roundps_epi32(_mm512_mul_ps(a, inv), kRound)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(_mm512_cvt_roundps_epi32(_mm512_mul_ps(b, inv), kRound)));
  *d_out = d;
  *s_out = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

template <typename In>
void multiply(const at::Tensor& x, const at::Tensor& w, at::Tensor& out, int64_t n) {
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, NB = n / kBlock;
  at::Tensor qx = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor scales = at::empty({2, M, G}, x.options().dtype(at::kFloat));
  const In* xp = x.data_ptr<In>();
  int8_t* qp = qx.data_ptr<int8_t>();
  float* dp = scales.data_ptr<float>();
  float* sp = dp + M * G;
  for (int64_t i = 0; i < M * G; ++i) {
    const In* xi = xp + i * kGroup;
    if constexpr (std::is_same_v<In, float>) {
      quantize_group(_mm512_loadu_ps(xi), _mm512_loadu_ps(xi + 16), qp + i * kGroup, dp + i, sp + i);
    } else {
      quantize_group(from_bf16(xi), from_bf16(xi + 16), qp + i * kGroup, dp + i, sp + i);
    }
  }
  In* op = out.data_ptr<In>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  over_blocks(M, NB, kMaxRows, [&](int64_t rows, int64_t r0, int64_t nb) {
    kBlockRows<In>[rows](qp + r0 * K, dp + r0 * G, sp + r0 * G, K, G, wp + nb * G * kRecord, op + r0 * n + nb * kBlock, n);
  });
}

// x [M, K] -> [M, n]: bfloat16 in and out for bfloat16 x, float32 out for any other.
at::Tensor q4q8_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "q4q8_mm: x must be a 2-D CPU tensor");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kRecord && w.scalar_type() == at::kByte && w.is_contiguous(),
              "q4q8_mm: w must be contiguous uint8 [N/16, K/32, 320]");
  const int64_t M = x_in.size(0), K = x_in.size(1);
  TORCH_CHECK(K % kGroup == 0 && n % kBlock == 0 && w.size(0) == n / kBlock && w.size(1) == K / kGroup,
              "q4q8_mm: shapes do not match: x ", x_in.sizes(), ", w ", w.sizes(), ", n ", n);
  const bool bf16 = x_in.scalar_type() == at::kBFloat16;
  const at::Tensor x = bf16 ? x_in.contiguous() : x_in.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  if (bf16) {
    multiply<c10::BFloat16>(x, w, out, n);
  } else {
    multiply<float>(x, w, out, n);
  }
  return out;
}


// ---- bfloat16 activations (AVX512-BF16): the same records, codes as bfloat16 128 + q.
// 4 accumulators per row: 8 rows spill a few registers, and still beat two passes over
// the block (measured: 7 rows 4.7 against 5.2 ms for a step's 120 products).
template <int R>
__attribute__((target("avx512bf16"))) void block_rows_bf16(const c10::BFloat16* x, const float* sx, int64_t K, int64_t G,
                                                           const uint8_t* w, c10::BFloat16* out, int64_t ldo) {
  __m512 tot_lo[R], tot_hi[R];
  for (int r = 0; r < R; ++r) tot_lo[r] = tot_hi[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i bias = _mm512_set1_epi8(0x43);  // high byte of bfloat16 128.0: word 0x43qq = 128 + q
  // lane 4L + t of an unpacklo (unpackhi) product belongs to output 4L + t/2 (4L + 2 + t/2)
  const __m512i dup_lo = _mm512_setr_epi32(0, 0, 1, 1, 4, 4, 5, 5, 8, 8, 9, 9, 12, 12, 13, 13);
  const __m512i dup_hi = _mm512_setr_epi32(2, 2, 3, 3, 6, 6, 7, 7, 10, 10, 11, 11, 14, 14, 15, 15);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* rec = w + g * kRecord;
    for (int64_t line = 0; line < kRecord; line += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + line), _MM_HINT_T0);
    __m512 dot_lo[R], dot_hi[R];
    for (int r = 0; r < R; ++r) dot_lo[r] = dot_hi[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(rec + 64 * p);
      const __m512i lo = _mm512_and_si512(v, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      const __m512bh lo_lo = (__m512bh)_mm512_unpacklo_epi8(lo, bias), lo_hi = (__m512bh)_mm512_unpackhi_epi8(lo, bias);
      const __m512bh hi_lo = (__m512bh)_mm512_unpacklo_epi8(hi, bias), hi_hi = (__m512bh)_mm512_unpackhi_epi8(hi, bias);
      for (int r = 0; r < R; ++r) {
        const c10::BFloat16* xr = x + r * K + g * kGroup + 8 * p;
        int64_t xa, xb;
        __builtin_memcpy(&xa, xr, 8);
        __builtin_memcpy(&xb, xr + 4, 8);
        const __m512bh a = (__m512bh)_mm512_set1_epi64(xa), b = (__m512bh)_mm512_set1_epi64(xb);
        dot_lo[r] = _mm512_dpbf16_ps(dot_lo[r], lo_lo, a);
        dot_hi[r] = _mm512_dpbf16_ps(dot_hi[r], lo_hi, a);
        dot_lo[r] = _mm512_dpbf16_ps(dot_lo[r], hi_lo, b);
        dot_hi[r] = _mm512_dpbf16_ps(dot_hi[r], hi_hi, b);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 288)));
    const __m512 shifted = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.0f), m);  // m - 128 d: the codes carry + 128
    const __m512 d_lo = _mm512_permutexvar_ps(dup_lo, d), d_hi = _mm512_permutexvar_ps(dup_hi, d);
    const __m512 m_lo = _mm512_maskz_permutexvar_ps(0x5555, dup_lo, shifted), m_hi = _mm512_maskz_permutexvar_ps(0x5555, dup_hi, shifted);
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(sx[r * G + g]);
      tot_lo[r] = _mm512_fmadd_ps(m_lo, s, _mm512_fmadd_ps(dot_lo[r], d_lo, tot_lo[r]));
      tot_hi[r] = _mm512_fmadd_ps(m_hi, s, _mm512_fmadd_ps(dot_hi[r], d_hi, tot_hi[r]));
    }
  }
  // output 4L + u: lanes 4L + 2u, 4L + 2u + 1 of tot_lo (u < 2), of tot_hi at 4L + 2(u - 2), ... (u >= 2)
  const __m512i even = _mm512_setr_epi32(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int r = 0; r < R; ++r) {
    const __m512 y = _mm512_add_ps(_mm512_permutex2var_ps(tot_lo[r], even, tot_hi[r]), _mm512_permutex2var_ps(tot_lo[r], odd, tot_hi[r]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), to_bf16(y));
  }
}

using BlockRowsBf16 = void (*)(const c10::BFloat16*, const float*, int64_t, int64_t, const uint8_t*, c10::BFloat16*, int64_t);
constexpr int64_t kMaxRowsBf16 = 8;
constexpr BlockRowsBf16 kBlockRowsBf16[kMaxRowsBf16 + 1] = {nullptr, block_rows_bf16<1>, block_rows_bf16<2>, block_rows_bf16<3>,
                                                           block_rows_bf16<4>, block_rows_bf16<5>, block_rows_bf16<6>,
                                                           block_rows_bf16<7>, block_rows_bf16<8>};

at::Tensor q4bf16_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.scalar_type() == at::kBFloat16, "q4bf16_mm: x must be 2-D bfloat16 on a CPU");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kRecord && w.scalar_type() == at::kByte && w.is_contiguous(),
              "q4bf16_mm: w must be contiguous uint8 [N/16, K/32, 320]");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / kGroup, NB = n / kBlock;
  TORCH_CHECK(K % kGroup == 0 && n % kBlock == 0 && w.size(0) == NB && w.size(1) == G,
              "q4bf16_mm: shapes do not match: x ", x_in.sizes(), ", w ", w.sizes(), ", n ", n);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  at::Tensor sums = at::empty({M, G}, x.options().dtype(at::kFloat));
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  float* sp = sums.data_ptr<float>();
  for (int64_t i = 0; i < M * G; ++i) sp[i] = _mm512_reduce_add_ps(_mm512_add_ps(from_bf16(xp + i * kGroup), from_bf16(xp + i * kGroup + 16)));
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  over_blocks(M, NB, kMaxRowsBf16, [&](int64_t rows, int64_t r0, int64_t nb) {
    kBlockRowsBf16[rows](xp + r0 * K, sp + r0 * G, K, G, wp + nb * G * kRecord, op + r0 * n + nb * kBlock, n);
  });
  return out;
}

// ---- int8 weights, bfloat16 activations (AVX512-BF16). Weights: int8 [N/16, K/2, 16, 2],
// per block of 16 outputs and pair of inputs the 16 outputs' two weights side by side
// (VDPBF16PS multiplies pairs), scales float32 [N]:
//   y[r, n] = scale[n] * sum_k q[n, k] x[r, k].
// A code becomes bfloat16 exactly (|q| <= 127 needs 7 bits). Two sums per row (even and
// odd pairs of pairs) shorten the chain of dependent dot products; they are added last.
// Each row's sums over inputs k .. k + 3 of the pair layout: w0 holds 16 outputs' weights
// for inputs k, k + 1 (into `even`), w1 for k + 2, k + 3 (into `odd`).
template <int R>
__attribute__((target("avx512bf16"), always_inline)) inline void dot_four(__m512* even, __m512* odd, __m512bh w0, __m512bh w1,
                                                                          const c10::BFloat16* x, int64_t K, int64_t k) {
  for (int r = 0; r < R; ++r) {
    const c10::BFloat16* xr = x + r * K + k;
    int32_t xa, xb;
    __builtin_memcpy(&xa, xr, 4);
    __builtin_memcpy(&xb, xr + 2, 4);
    even[r] = _mm512_dpbf16_ps(even[r], w0, (__m512bh)_mm512_set1_epi32(xa));
    odd[r] = _mm512_dpbf16_ps(odd[r], w1, (__m512bh)_mm512_set1_epi32(xb));
  }
}

template <int R>
__attribute__((target("avx512bf16"))) void block_rows_q8(const c10::BFloat16* x, int64_t K, const int8_t* w, const float* scale,
                                                         c10::BFloat16* out, int64_t ldo) {
  __m512 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 4) {  // 64 bytes: inputs k, k + 1 (32 bytes) and k + 2, k + 3
    const int8_t* line = w + k * kBlock;
    _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetch), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(line);
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_castsi512_si128(v)));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1)));
    const __m512 f2 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2)));
    const __m512 f3 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3)));
    const __m512bh w0 = _mm512_cvtne2ps_pbh(f1, f0), w1 = _mm512_cvtne2ps_pbh(f3, f2);
    dot_four<R>(even, odd, w0, w1, x, K, k);
  }
  const __m512 s = _mm512_loadu_ps(scale);
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), to_bf16(_mm512_mul_ps(_mm512_add_ps(even[r], odd[r]), s)));
  }
}

using BlockRowsQ8 = void (*)(const c10::BFloat16*, int64_t, const int8_t*, const float*, c10::BFloat16*, int64_t);
constexpr BlockRowsQ8 kBlockRowsQ8[kMaxRowsBf16 + 1] = {nullptr, block_rows_q8<1>, block_rows_q8<2>, block_rows_q8<3>,
                                                       block_rows_q8<4>, block_rows_q8<5>, block_rows_q8<6>,
                                                       block_rows_q8<7>, block_rows_q8<8>};

at::Tensor q8bf16_mm(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& scales, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.scalar_type() == at::kBFloat16, "q8bf16_mm: x must be 2-D bfloat16 on a CPU");
  TORCH_CHECK(w.dim() == 4 && w.size(2) == kBlock && w.size(3) == 2 && w.scalar_type() == at::kChar && w.is_contiguous(),
              "q8bf16_mm: w must be contiguous int8 [N/16, K/2, 16, 2]");
  TORCH_CHECK(scales.dim() == 1 && scales.scalar_type() == at::kFloat && scales.is_contiguous(), "q8bf16_mm: scales must be contiguous float32 [N]");
  const int64_t M = x_in.size(0), K = x_in.size(1), NB = n / kBlock;
  TORCH_CHECK(K % 4 == 0 && n % kBlock == 0 && w.size(0) == NB && w.size(1) * 2 == K && scales.size(0) == n,
              "q8bf16_mm: shapes do not match: x ", x_in.sizes(), ", w ", w.sizes(), ", scales ", scales.sizes(), ", n ", n);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  over_blocks(M, NB, kMaxRowsBf16, [&](int64_t rows, int64_t r0, int64_t nb) {
    kBlockRowsQ8[rows](xp + r0 * K, K, wp + nb * K * kBlock, sp + nb * kBlock, op + r0 * n + nb * kBlock, n);
  });
  return out;
}

// ---- bfloat16 weights and activations (AVX512-BF16). Weights: bfloat16 [N/16, K/2, 16, 2],
// as the int8 layout above; y[r, n] = sum_k w[n, k] x[r, k], two sums per row.
template <int R>
__attribute__((target("avx512bf16"))) void block_rows_b16(const c10::BFloat16* x, int64_t K, const c10::BFloat16* w,
                                                          c10::BFloat16* out, int64_t ldo) {
  __m512 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 4) {  // 128 bytes: inputs k, k + 1 (64 bytes) and k + 2, k + 3
    const c10::BFloat16* line = w + k * kBlock;
    _mm_prefetch(reinterpret_cast<const char*>(line) + kPrefetch, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(line) + kPrefetch + 64, _MM_HINT_T0);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(line), w1 = (__m512bh)_mm512_loadu_si512(line + 32);
    dot_four<R>(even, odd, w0, w1, x, K, k);
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo), to_bf16(_mm512_add_ps(even[r], odd[r])));
  }
}

using BlockRowsB16 = void (*)(const c10::BFloat16*, int64_t, const c10::BFloat16*, c10::BFloat16*, int64_t);
constexpr BlockRowsB16 kBlockRowsB16[kMaxRowsBf16 + 1] = {nullptr, block_rows_b16<1>, block_rows_b16<2>, block_rows_b16<3>,
                                                         block_rows_b16<4>, block_rows_b16<5>, block_rows_b16<6>,
                                                         block_rows_b16<7>, block_rows_b16<8>};

at::Tensor bf16_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.scalar_type() == at::kBFloat16, "bf16_mm: x must be 2-D bfloat16 on a CPU");
  TORCH_CHECK(w.dim() == 4 && w.size(2) == kBlock && w.size(3) == 2 && w.scalar_type() == at::kBFloat16 && w.is_contiguous(),
              "bf16_mm: w must be contiguous bfloat16 [N/16, K/2, 16, 2]");
  const int64_t M = x_in.size(0), K = x_in.size(1), NB = n / kBlock;
  TORCH_CHECK(K % 4 == 0 && n % kBlock == 0 && w.size(0) == NB && w.size(1) * 2 == K,
              "bf16_mm: shapes do not match: x ", x_in.sizes(), ", w ", w.sizes(), ", n ", n);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const c10::BFloat16* wp = w.data_ptr<c10::BFloat16>();
  over_blocks(M, NB, kMaxRowsBf16, [&](int64_t rows, int64_t r0, int64_t nb) {
    kBlockRowsB16[rows](xp + r0 * K, K, wp + nb * K * kBlock, op + r0 * n + nb * kBlock, n);
  });
  return out;
}

// ---- attention of a few query rows over a bfloat16 cache (AVX512-BF16). Every (row, head)
// is computed by the same instructions whatever the other rows and however many keys the
// window holds beyond the ones its mask lets through, or where in the window they sit:
// scores in float32 (key blocks of 16, zero-padded), softmax in float32, its sum and the
// output summed over the seen keys in order and rounded to bfloat16 once. So a token's
// attention output is the same bits in a decoding step and in any verifying step.

// Lane j of the result: the sum of the 16 lanes of v[j] (a transposed sum of 16 vectors).
inline __m512 sum_lanes16(const __m512* v) {
  __m512 s[8], t[4];
  for (int i = 0; i < 8; ++i) s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
  const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// exp(x) for x <= 0: Cephes' expf polynomial (about 1 ulp), exactly 0 below -87.3, so
// masked keys weigh nothing.
inline __m512 exp_nonpositive(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(live, p, n);
}

constexpr int64_t kMaxHeadDim = 256;

// One query row of one head: out[D] = softmax_w(q . k[w] * scaling + mask[w]) . v[w] over
// w < W. `scores`: room for W rounded up to 16 floats.
template <typename Mask>
__attribute__((target("avx512bf16"))) void attend_row(const c10::BFloat16* q, const c10::BFloat16* k, const c10::BFloat16* v, int64_t ldk,
                                                      int64_t ldv, const Mask* mask, int64_t W, int64_t D, float scaling,
                                                      float* scores, c10::BFloat16* out) {
  const int64_t chunks = (D + 31) / 32, blocks = (W + 15) / 16;
  __m512bh qv[kMaxHeadDim / 32];
  __mmask32 lanes[kMaxHeadDim / 32];  // the head dimensions of each chunk of 32 (D: a multiple of 16)
  for (int64_t c = 0; c < chunks; ++c) {
    lanes[c] = D - 32 * c >= 32 ? ~__mmask32(0) : (__mmask32(1) << (D - 32 * c)) - 1;
    qv[c] = (__m512bh)_mm512_maskz_loadu_epi16(lanes[c], q + 32 * c);
  }
  __m512 best = _mm512_set1_ps(-INFINITY);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t w0 = b * 16, n = std::min<int64_t>(16, W - w0);
    __m512 dots[16];
    for (int64_t j = 0; j < 16; ++j) {
      dots[j] = _mm512_setzero_ps();
      if (j >= n) continue;
      const c10::BFloat16* kj = k + (w0 + j) * ldk;
      for (int64_t c = 0; c < chunks; ++c) {
        dots[j] = _mm512_dpbf16_ps(dots[j], (__m512bh)_mm512_maskz_loadu_epi16(lanes[c], kj + 32 * c), qv[c]);
      }
    }
    const __mmask16 valid = n == 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
    __m512 m;
    if constexpr (std::is_same_v<Mask, float>) {
      m = _mm512_maskz_loadu_ps(valid, mask + w0);
    } else {
      m = from_bf16(mask + w0, valid);
    }
    const __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), _mm512_fmadd_ps(sum_lanes16(dots), _mm512_set1_ps(scaling), m));
    _mm512_storeu_ps(scores + w0, s);
    best = _mm512_max_ps(best, s);
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  for (int64_t b = 0; b < blocks; ++b) {
    _mm512_storeu_ps(scores + 16 * b, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + 16 * b), top)));
  }
  // The weights and the softmax's sum both in key order over the keys the mask lets
  // through, so where a key sits in the window does not matter either (a tree's row sees
  // its ancestors at other slots than a chain's). The sum's chain of adds hides behind
  // the FMAs' own.
  const int64_t vecs = D / 16;
  __m512 o[kMaxHeadDim / 16];
  for (int64_t i = 0; i < vecs; ++i) o[i] = _mm512_setzero_ps();
  float total = 0.0f;
  for (int64_t w = 0; w < W; ++w) {
    if (scores[w] == 0.0f) continue;  // a masked key (or one too far below the best to count)
    total += scores[w];
    const __m512 p = _mm512_set1_ps(scores[w]);
    const c10::BFloat16* vw = v + w * ldv;
    for (int64_t i = 0; i < vecs; ++i) o[i] = _mm512_fmadd_ps(p, from_bf16(vw + 16 * i), o[i]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t i = 0; i < vecs; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * i), to_bf16(_mm512_mul_ps(o[i], inv)));
}

// query [B, H, R, D], key and value [B, H_kv, W, D] (bfloat16, each row contiguous), an
// additive mask [B, 1 or H, R, W] (bfloat16 or float32) -> output [B, R, H, D] bfloat16.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask_in, double scaling) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask_in.dim() == 4, "attention: query, key, value and mask must be 4-D");
  TORCH_CHECK(query.device().is_cpu() && query.scalar_type() == at::kBFloat16 && key.scalar_type() == at::kBFloat16 &&
              value.scalar_type() == at::kBFloat16, "attention: query, key and value must be bfloat16 on a CPU");
  const int64_t B = query.size(0), H = query.size(1), R = query.size(2), D = query.size(3), Hkv = key.size(1), W = key.size(2);
  TORCH_CHECK(D % 16 == 0 && D <= kMaxHeadDim && Hkv > 0 && H % Hkv == 0 && key.size(0) == B && key.size(3) == D && value.sizes() == key.sizes() && W > 0,
              "attention: shapes do not match: query ", query.sizes(), ", key ", key.sizes(), ", value ", value.sizes());
  TORCH_CHECK(mask_in.size(0) == B && (mask_in.size(1) == 1 || mask_in.size(1) == H) && mask_in.size(2) == R && mask_in.size(3) == W,
              "attention: the mask ", mask_in.sizes(), " does not match query ", query.sizes(), " and key ", key.sizes());
  TORCH_CHECK(mask_in.scalar_type() == at::kBFloat16 || mask_in.scalar_type() == at::kFloat, "attention: the mask must be bfloat16 or float32");
  const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
  const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
  const at::Tensor mask = mask_in.stride(3) == 1 ? mask_in : mask_in.contiguous();
  at::Tensor out = at::empty({B, R, H, D}, q.options());
  const int64_t groups = H / Hkv, mask_heads = mask.size(1);
  const float scale = static_cast<float>(scaling);
  at::parallel_for(0, B * H * R, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> scores((W + 15) / 16 * 16);
    for (int64_t u = u0; u < u1; ++u) {  // u: (batch, head, row)
      const int64_t r = u % R, h = u / R % H, b = u / (R * H), kvh = h / groups;
      const c10::BFloat16* qp = q.data_ptr<c10::BFloat16>() + b * q.stride(0) + h * q.stride(1) + r * q.stride(2);
      const c10::BFloat16* kp = k.data_ptr<c10::BFloat16>() + b * k.stride(0) + kvh * k.stride(1);
      const c10::BFloat16* vp = v.data_ptr<c10::BFloat16>() + b * v.stride(0) + kvh * v.stride(1);
      const int64_t moff = b * mask.stride(0) + (mask_heads == 1 ? 0 : h) * mask.stride(1) + r * mask.stride(2);
      c10::BFloat16* op = out.data_ptr<c10::BFloat16>() + ((b * R + r) * H + h) * D;
      if (mask.scalar_type() == at::kFloat) {
        attend_row(qp, kp, vp, k.stride(2), v.stride(2), mask.data_ptr<float>() + moff, W, D, scale, scores.data(), op);
      } else {
        attend_row(qp, kp, vp, k.stride(2), v.stride(2), mask.data_ptr<c10::BFloat16>() + moff, W, D, scale, scores.data(), op);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(pardec_q4, m) {
  m.def("q4q8_mm(Tensor x, Tensor w, int n) -> Tensor");
  m.def("q4bf16_mm(Tensor x, Tensor w, int n) -> Tensor");
  m.def("q8bf16_mm(Tensor x, Tensor w, Tensor scales, int n) -> Tensor");
  m.def("bf16_mm(Tensor x, Tensor w, int n) -> Tensor");
  m.def("attention(Tensor query, Tensor key, Tensor value, Tensor mask, float scaling) -> Tensor");
}
TORCH_LIBRARY_IMPL(pardec_q4, CPU, m) {
  m.impl("q4q8_mm", &q4q8_mm);
  m.impl("q4bf16_mm", &q4bf16_mm);
  m.impl("q8bf16_mm", &q8bf16_mm);
  m.impl("bf16_mm", &bf16_mm);
  m.impl("attention", &attention);
}

// pardec's products for float32 activations on CPUs with AVX2 and FMA (no AVX512 needed):
//   pardec_avx2::f32_mm  float32 weights w [N, K] (an nn.Linear's own, not copied):
//                        dense layers and the output head in float32;
//   pardec_avx2::q8f32_mm  int8 weights q [N, K] with one float32 scale per output
//                        (`quant.Int8Linear`'s own): y = (x @ q.T) * scale.
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

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

}  // namespace

TORCH_LIBRARY(pardec_avx2, m) {
  m.def("f32_mm(Tensor x, Tensor w) -> Tensor");
  m.def("q8f32_mm(Tensor x, Tensor q, Tensor scales) -> Tensor");
}
TORCH_LIBRARY_IMPL(pardec_avx2, CPU, m) {
  m.impl("f32_mm", &f32_mm);
  m.impl("q8f32_mm", &q8f32_mm);
}

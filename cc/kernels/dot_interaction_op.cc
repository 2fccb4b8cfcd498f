/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// DLRM's pairwise interactions as one op each way. The model computed matmul(x, x^T) per example (all F^2
// products), kept the strict upper triangle (UpperTriangle), and its backward ran two more batch matmuls (grad x and
// grad^T x) on the unpacked triangle: 3 F^2 D multiply-adds per example, with Eigen's batch-matmul overhead for
// matrices of 27 x 16. Here the forward computes only the F (F - 1) / 2 dot products it keeps (F (F - 1) D / 2
// multiply-adds), and the backward one product with the symmetric gradient, each row of x_grad summed in registers
// and written once (F (F - 1) D): half as many in all. Each example is one thread's, in a fixed order, so a value
// does not depend on the batch or the thread count. On x86-64 CPUs with AVX2 and FMA the inner loops run 8 floats
// at a time (chosen once at run time: the library itself is built for the baseline instruction set); the portable
// loops compute the same sums in another rounding (TF_FUSEDREC_PORTABLE_KERNELS=1 forces them).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FUSEDREC_DOT_AVX2 1
#endif

namespace tensorflow {
namespace fusedrec {
namespace {

// Multiply-adds per task below which one thread does the whole batch.
constexpr int64_t kMinWorkPerTask = int64_t{1} << 18;

void ForwardPortable(const float* x, int64_t f, int64_t d, float* out) {
  for (int64_t i = 0; i + 1 < f; ++i) {
    const float* xi = x + i * d;
    for (int64_t j = i + 1; j < f; ++j) {
      const float* xj = x + j * d;
      float sum = 0.f;
      for (int64_t k = 0; k < d; ++k) sum += xi[k] * xj[k];
      *out++ = sum;
    }
  }
}

// The gradient of row i, its pairs' gradients in the order j = 0 .. F - 1 (j != i): pairs (j, i) for j < i, then the
// contiguous run (i, i + 1 ..). row_start[i] is the index of pair (i, i + 1).
inline float PairGrad(const float* grad, const int64_t* row_start, int64_t i, int64_t j) {
  return j < i ? grad[row_start[j] + (i - j - 1)] : grad[row_start[i] + (j - i - 1)];
}

void BackwardPortable(const float* grad, const float* x, int64_t f, int64_t d, const int64_t* row_start, float* dx,
                      int64_t dx_stride) {
  for (int64_t i = 0; i < f; ++i) {
    float* dxi = dx + i * dx_stride;
    std::fill(dxi, dxi + d, 0.f);
    for (int64_t j = 0; j < f; ++j) {
      if (j == i) continue;
      const float g = PairGrad(grad, row_start, i, j);
      const float* xj = x + j * d;
      for (int64_t k = 0; k < d; ++k) dxi[k] += g * xj[k];
    }
  }
}

#ifdef FUSEDREC_DOT_AVX2

__attribute__((target("avx2,fma"))) inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void ForwardAvx2(const float* x, int64_t f, int64_t d, float* out) {
  const int64_t d8 = d & ~int64_t{7};
  for (int64_t i = 0; i + 1 < f; ++i) {
    const float* xi = x + i * d;
    int64_t j = i + 1;
    for (; j + 4 <= f; j += 4) {  // four dot products at once, summed across lanes together
      const float* x0 = x + j * d;
      const float* x1 = x0 + d;
      const float* x2 = x1 + d;
      const float* x3 = x2 + d;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t k = 0; k < d8; k += 8) {
        const __m256 v = _mm256_loadu_ps(xi + k);
        a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + k), a1);
        a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + k), a2);
        a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x3 + k), a3);
      }
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
      __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));  // [dot0, dot1, dot2, dot3]
      if (d8 < d) {
        float tail[4] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t k = d8; k < d; ++k) {
          tail[0] += xi[k] * x0[k];
          tail[1] += xi[k] * x1[k];
          tail[2] += xi[k] * x2[k];
          tail[3] += xi[k] * x3[k];
        }
        r = _mm_add_ps(r, _mm_loadu_ps(tail));
      }
      _mm_storeu_ps(out, r);
      out += 4;
    }
    for (; j < f; ++j) {
      const float* xj = x + j * d;
      __m256 a = _mm256_setzero_ps();
      for (int64_t k = 0; k < d8; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(xi + k), _mm256_loadu_ps(xj + k), a);
      float sum = Sum8(a);
      for (int64_t k = d8; k < d; ++k) sum += xi[k] * xj[k];
      *out++ = sum;
    }
  }
}

// Where the R rows of a block find their pair gradients side by side, without PairGrad's branch: the rows below j
// (i > j) in grad itself (pairs (j, i) are contiguous in i: row j of the triangle), the rows above j (i < j) in the
// mirror gm[j * F + i] = grad of pair (i, j), written once per example (MirrorGrad).
void MirrorGrad(const float* grad, int64_t f, float* gm) {
  for (int64_t i = 0, p = 0; i < f; ++i) {
    for (int64_t j = i + 1; j < f; ++j, ++p) gm[j * f + i] = grad[p];
  }
}

// One j outside the block [i0, i0 + R): every row of the block takes x_j times its pair gradient (gj[r]: row
// i0 + r's).
template <int N, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void AllRowsStep(const float* gj, const float* x, int64_t d,
                                                                           int64_t k0, int64_t j,
                                                                           __m256 (&acc)[R][N]) {
  const float* xj = x + j * d + k0;
  __m256 xv[N];
#pragma GCC unroll 4
  for (int v = 0; v < N; ++v) xv[v] = _mm256_loadu_ps(xj + 8 * v);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 g = _mm256_broadcast_ss(gj + r);
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) acc[r][v] = _mm256_fmadd_ps(g, xv[v], acc[r][v]);
  }
}

// Rows i0 .. i0 + R - 1 of the gradient, N vectors of 8 floats from column k0 on, held in registers over all j:
// R * N independent sums, so the multiply-adds do not wait on one another's latency, and each x_j vector is loaded
// once for R rows (one row at a time left 2 chains at D = 16: the op ran at the FMA latency, 1.5x slower). Every
// element is the same sum of fused multiply-adds in the same order (j = 0 .. F - 1, j != i) as one row at a time, so
// the results are bit for bit those of that kernel (801cd3f).
template <int N, int R>
__attribute__((target("avx2,fma"))) inline void BackwardRowsAvx2(const float* grad, const int64_t* row_start,
                                                                 const float* gm, const float* x, int64_t f,
                                                                 int64_t d, int64_t i0, int64_t k0, float* dx,
                                                                 int64_t dx_stride) {
  __m256 acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < i0; ++j) AllRowsStep<N, R>(grad + row_start[j] + (i0 - j - 1), x, d, k0, j, acc);
  // j inside the block: row i0 + jj skips itself (constants once unrolled: no branch is left).
#pragma GCC unroll 8
  for (int jj = 0; jj < R; ++jj) {
    const int64_t j = i0 + jj;
    const float* xj = x + j * d + k0;
    const float* above = gm + j * f + i0;  // rows r < jj; rows r > jj: pair (j, i0 + r), row j of grad
    __m256 xv[N];
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) xv[v] = _mm256_loadu_ps(xj + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (r == jj) continue;
      const __m256 g = _mm256_broadcast_ss(r < jj ? above + r : grad + (row_start[j] + (r - jj - 1)));
#pragma GCC unroll 4
      for (int v = 0; v < N; ++v) acc[r][v] = _mm256_fmadd_ps(g, xv[v], acc[r][v]);
    }
  }
  for (int64_t j = i0 + R; j < f; ++j) AllRowsStep<N, R>(gm + j * f + i0, x, d, k0, j, acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < N; ++v) _mm256_storeu_ps(dx + (i0 + r) * dx_stride + k0 + 8 * v, acc[r][v]);
  }
}

// Columns [k0, k0 + 8 N) of every row: blocks of R = 8 / N rows (8 accumulators), then the rows left as one block.
template <int N>
__attribute__((target("avx2,fma"))) inline void BackwardColumnsAvx2(const float* grad, const int64_t* row_start,
                                                                    const float* gm, const float* x, int64_t f,
                                                                    int64_t d, int64_t k0, float* dx,
                                                                    int64_t dx_stride) {
  constexpr int R = 8 / N;
  int64_t i = 0;
  for (; i + R <= f; i += R) BackwardRowsAvx2<N, R>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
  switch (f - i) {  // 0 .. R - 1 rows left
    case 7: return BackwardRowsAvx2<N, (R > 7 ? 7 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 6: return BackwardRowsAvx2<N, (R > 6 ? 6 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 5: return BackwardRowsAvx2<N, (R > 5 ? 5 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 4: return BackwardRowsAvx2<N, (R > 4 ? 4 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 3: return BackwardRowsAvx2<N, (R > 3 ? 3 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 2: return BackwardRowsAvx2<N, (R > 2 ? 2 : 1)>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    case 1: return BackwardRowsAvx2<N, 1>(grad, row_start, gm, x, f, d, i, k0, dx, dx_stride);
    default: return;
  }
}

// gm: F x F floats of scratch for the mirrored pair gradients.
__attribute__((target("avx2,fma"))) void BackwardAvx2(const float* grad, const float* x, int64_t f, int64_t d,
                                                      const int64_t* row_start, float* dx, int64_t dx_stride,
                                                      float* gm) {
  MirrorGrad(grad, f, gm);
  const int64_t d8 = d & ~int64_t{7};
  int64_t k0 = 0;
  for (; k0 + 32 <= d8; k0 += 32) BackwardColumnsAvx2<4>(grad, row_start, gm, x, f, d, k0, dx, dx_stride);
  if (k0 + 16 <= d8) {
    BackwardColumnsAvx2<2>(grad, row_start, gm, x, f, d, k0, dx, dx_stride);
    k0 += 16;
  }
  if (k0 + 8 <= d8) {
    BackwardColumnsAvx2<1>(grad, row_start, gm, x, f, d, k0, dx, dx_stride);
    k0 += 8;
  }
  for (int64_t i = 0; i < f; ++i) {
    float* dxi = dx + i * dx_stride;
    for (int64_t k = k0; k < d; ++k) {
      float sum = 0.f;
      for (int64_t j = 0; j < f; ++j) {
        if (j != i) sum += PairGrad(grad, row_start, i, j) * x[j * d + k];
      }
      dxi[k] = sum;
    }
  }
}

// TF_FUSEDREC_PORTABLE_KERNELS=1 (read once) runs the portable loops on any CPU: how the tests reach them here.
bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           std::getenv("TF_FUSEDREC_PORTABLE_KERNELS") == nullptr;
  return have;
}

#endif  // FUSEDREC_DOT_AVX2

void Forward(const float* x, int64_t f, int64_t d, float* out) {
#ifdef FUSEDREC_DOT_AVX2
  if (HaveAvx2()) return ForwardAvx2(x, f, d, out);
#endif
  ForwardPortable(x, f, d, out);
}

// gm: F x F floats of scratch (used by the AVX2 loops).
void Backward(const float* grad, const float* x, int64_t f, int64_t d, const int64_t* row_start, float* dx,
              int64_t dx_stride, float* gm) {
#ifdef FUSEDREC_DOT_AVX2
  if (HaveAvx2()) return BackwardAvx2(grad, x, f, d, row_start, dx, dx_stride, gm);
#endif
  BackwardPortable(grad, x, f, d, row_start, dx, dx_stride);
}

// Runs examples(begin, end) over [0, batch), split into tasks of at least kMinWorkPerTask multiply-adds.
void OverExamples(OpKernelContext* ctx, int64_t batch, int64_t work_per_example,
                  const std::function<void(int64_t, int64_t)>& examples) {
  ParallelRanges(ctx, batch, std::max<int64_t>(1, kMinWorkPerTask / std::max<int64_t>(1, work_per_example)), examples);
}

// Examples ahead whose rows GatherRows asks the caches for: F streams, one row each per example, more than a
// core's hardware prefetchers follow.
constexpr int64_t kPrefetchAhead = 4;

// The feature-major layouts: x [F, B, D] (feature_major=true), or the F tensors [B, D] of DotInteractionN. Example b's
// vector i is at bases[i] + b * D. Each task copies an example's rows into a contiguous scratch of F x D floats and
// runs the example-major loops on it (reading the rows in place, B * D floats apart, would alias them in the caches:
// the rows of an example fall in one cache set when B * D * 4 bytes is a multiple of its period); the gradient is
// written in place, [F, B, D]. So every value is bit for bit the example-major op's on the transposed x. The layout
// is what tf.stack(vectors, axis=0) builds and what tf.unstack(x_grad, axis=0) splits without copying (TensorFlow's
// Unpack shares the buffer along axis 0), where the example-major stack's unstack copied every row in the backward.
//
// GatherRows copies example b's F rows to dst (F x D floats), asking for example b + kPrefetchAhead's while at it
// (when < batch).
inline void GatherRows(const std::vector<const float*>& bases, int64_t b, int64_t batch, int64_t d, float* dst) {
  const bool ahead = b + kPrefetchAhead < batch;
  for (size_t i = 0; i < bases.size(); ++i) {
    if (ahead) __builtin_prefetch(bases[i] + (b + kPrefetchAhead) * d);
    const float* from = bases[i] + b * d;
    float* to = dst + i * d;
    for (int64_t k = 0; k < d; ++k) to[k] = from[k];
  }
}

void ForwardGathered(OpKernelContext* ctx, const std::vector<const float*>& bases, int64_t batch, int64_t d,
                     float* ys) {
  const int64_t f = static_cast<int64_t>(bases.size()), pairs = f * (f - 1) / 2;
  OverExamples(ctx, batch, pairs * d, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(f * d);  // one task's scratch: an example's rows, example-major
    for (int64_t b = begin; b < end; ++b) {
      GatherRows(bases, b, batch, d, rows.data());
      Forward(rows.data(), f, d, ys + b * pairs);
    }
  });
}

// gs: grad [B, P]; dxs: x_grad [F, B, D].
void BackwardGathered(OpKernelContext* ctx, const float* gs, const std::vector<const float*>& bases, int64_t batch,
                      int64_t d, const int64_t* row_start, float* dxs) {
  const int64_t f = static_cast<int64_t>(bases.size()), pairs = f * (f - 1) / 2;
  OverExamples(ctx, batch, 2 * pairs * d, [&](int64_t begin, int64_t end) {
    std::vector<float> gm(f * f), rows(f * d);  // one task's scratch
    for (int64_t b = begin; b < end; ++b) {
      GatherRows(bases, b, batch, d, rows.data());
      Backward(gs + b * pairs, rows.data(), f, d, row_start, dxs + b * d, batch * d, gm.data());
    }
  });
}

// The start of each row of the pair triangle: row_start[i] is the index of pair (i, i + 1).
std::vector<int64_t> RowStarts(int64_t f) {
  std::vector<int64_t> row_start(f);
  for (int64_t i = 0, p = 0; i < f; p += f - 1 - i, ++i) row_start[i] = p;
  return row_start;
}

// x's batch and F from its shape and the layout; an error names the layout's shape.
bool Dims(OpKernelContext* ctx, const Tensor& x, bool feature_major, int64_t* batch, int64_t* f, int64_t* d) {
  if (x.dims() != 3) {
    ctx->CtxFailure(errors::InvalidArgument("x must have shape ", feature_major ? "[F, B, D]" : "[B, F, D]", ", got ",
                                            x.shape().DebugString()));
    return false;
  }
  *batch = x.dim_size(feature_major ? 1 : 0);
  *f = x.dim_size(feature_major ? 0 : 1);
  *d = x.dim_size(2);
  return true;
}

// The rows of each vector of feature-major x [F, B, D].
std::vector<const float*> FeatureBases(const Tensor& x, int64_t f, int64_t batch, int64_t d) {
  std::vector<const float*> bases(f);
  for (int64_t i = 0; i < f; ++i) bases[i] = x.flat<float>().data() + i * batch * d;
  return bases;
}

// DotInteractionN's inputs "xs": F tensors [B, D] of one shape, or an error naming the first that differs.
bool ListDims(OpKernelContext* ctx, OpInputList* list, int64_t* batch, int64_t* d, std::vector<const float*>* bases) {
  const Status listed = ctx->input_list("xs", list);
  if (!listed.ok()) {
    ctx->CtxFailure(listed);
    return false;
  }
  const OpInputList& xs = *list;
  for (int i = 0; i < xs.size(); ++i) {
    if (xs[i].dims() != 2 || xs[i].shape() != xs[0].shape()) {
      ctx->CtxFailure(errors::InvalidArgument("xs must be tensors [B, D] of one shape: xs[0] is ",
                                              xs[0].shape().DebugString(), ", xs[", i, "] ",
                                              xs[i].shape().DebugString()));
      return false;
    }
    bases->push_back(xs[i].flat<float>().data());
  }
  *batch = xs[0].dim_size(0);
  *d = xs[0].dim_size(1);
  return true;
}

// Allocates pairs [B, F (F - 1) / 2] and returns its data, or nullptr when nothing is left to compute: an error, no
// pair or example, or D = 0 (every pair 0, written here).
float* AllocatePairs(OpKernelContext* ctx, int64_t batch, int64_t f, int64_t d) {
  const int64_t pairs = f * (f - 1) / 2;
  Tensor* out = nullptr;
  const Status allocated = ctx->allocate_output(0, TensorShape({batch, pairs}), &out);
  if (!allocated.ok()) {
    ctx->CtxFailure(allocated);
    return nullptr;
  }
  if (batch == 0 || pairs == 0) return nullptr;
  float* ys = out->flat<float>().data();
  if (d == 0) {
    std::fill(ys, ys + batch * pairs, 0.f);
    return nullptr;
  }
  return ys;
}

// Checks grad [B, P] (describe_x() names the vectors in the error, called only then) and allocates x_grad of
// `shape`; returns its data, or nullptr when nothing is left to compute: an error, no element, or no pair (x_grad
// all 0, written here).
template <typename DescribeX>
float* AllocateXGrad(OpKernelContext* ctx, const Tensor& grad, int64_t batch, int64_t f, DescribeX describe_x,
                     const TensorShape& shape) {
  const int64_t pairs = f * (f - 1) / 2;
  if (grad.dims() != 2 || grad.dim_size(0) != batch || grad.dim_size(1) != pairs) {
    ctx->CtxFailure(errors::InvalidArgument("grad must have shape [", batch, ", ", pairs, "] (", describe_x(),
                                            "), got ", grad.shape().DebugString()));
    return nullptr;
  }
  Tensor* dx = nullptr;
  const Status allocated = ctx->allocate_output(0, shape, &dx);
  if (!allocated.ok()) {
    ctx->CtxFailure(allocated);
    return nullptr;
  }
  float* dxs = dx->flat<float>().data();
  if (dx->NumElements() == 0) return nullptr;
  if (pairs == 0) {
    std::fill(dxs, dxs + dx->NumElements(), 0.f);
    return nullptr;
  }
  return dxs;
}

}  // namespace

class DotInteractionOp : public OpKernel {
 public:
  explicit DotInteractionOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_major", &feature_major_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    int64_t batch, f, d;
    if (!Dims(ctx, x, feature_major_, &batch, &f, &d)) return;
    float* ys = AllocatePairs(ctx, batch, f, d);
    if (ys == nullptr) return;
    if (feature_major_) return ForwardGathered(ctx, FeatureBases(x, f, batch, d), batch, d, ys);
    const float* xs = x.flat<float>().data();
    const int64_t pairs = f * (f - 1) / 2;
    OverExamples(ctx, batch, pairs * d, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) Forward(xs + b * f * d, f, d, ys + b * pairs);
    });
  }

 private:
  bool feature_major_ = false;
};

class DotInteractionGradOp : public OpKernel {
 public:
  explicit DotInteractionGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_major", &feature_major_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& x = ctx->input(1);
    int64_t batch, f, d;
    if (!Dims(ctx, x, feature_major_, &batch, &f, &d)) return;
    float* dxs = AllocateXGrad(ctx, grad, batch, f, [&] { return "x " + x.shape().DebugString(); }, x.shape());
    if (dxs == nullptr) return;
    const int64_t pairs = f * (f - 1) / 2;
    const float* gs = grad.flat<float>().data();
    const float* xs = x.flat<float>().data();
    const std::vector<int64_t> row_start = RowStarts(f);
    if (feature_major_) {
      return BackwardGathered(ctx, gs, FeatureBases(x, f, batch, d), batch, d, row_start.data(), dxs);
    }
    OverExamples(ctx, batch, 2 * pairs * d, [&](int64_t begin, int64_t end) {
      std::vector<float> gm(f * f);  // one task's scratch
      for (int64_t b = begin; b < end; ++b) {
        Backward(gs + b * pairs, xs + b * f * d, f, d, row_start.data(), dxs + b * f * d, d, gm.data());
      }
    });
  }

 private:
  bool feature_major_ = false;
};

// The F vectors as F inputs [B, D]: DLRM's embeddings as they come, without a stack before the op.
class DotInteractionNOp : public OpKernel {
 public:
  explicit DotInteractionNOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList xs;
    int64_t batch, d;
    std::vector<const float*> bases;
    if (!ListDims(ctx, &xs, &batch, &d, &bases)) return;
    float* ys = AllocatePairs(ctx, batch, xs.size(), d);
    if (ys != nullptr) ForwardGathered(ctx, bases, batch, d, ys);
  }
};

// The gradient of DotInteractionN, stacked feature-major [F, B, D]: unstacked along axis 0 without a copy.
class DotInteractionNGradOp : public OpKernel {
 public:
  explicit DotInteractionNGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    OpInputList xs;
    int64_t batch, d;
    std::vector<const float*> bases;
    if (!ListDims(ctx, &xs, &batch, &d, &bases)) return;
    const int64_t f = xs.size();
    float* dxs = AllocateXGrad(
        ctx, grad, batch, f, [&] { return std::to_string(f) + " tensors " + xs[0].shape().DebugString(); },
        TensorShape({f, batch, d}));
    if (dxs == nullptr) return;
    const std::vector<int64_t> row_start = RowStarts(f);
    BackwardGathered(ctx, grad.flat<float>().data(), bases, batch, d, row_start.data(), dxs);
  }
};

REGISTER_KERNEL_BUILDER(Name("FusedRec>DotInteraction").Device(DEVICE_CPU), DotInteractionOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>DotInteractionGrad").Device(DEVICE_CPU), DotInteractionGradOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>DotInteractionN").Device(DEVICE_CPU), DotInteractionNOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>DotInteractionNGrad").Device(DEVICE_CPU), DotInteractionNGradOp);

}  // namespace fusedrec
}  // namespace tensorflow

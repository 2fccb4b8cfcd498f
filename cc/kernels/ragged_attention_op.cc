/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// HSTU's pointwise causal attention over a ragged batch's flat tokens, forward and backward, without the pair lists.
// The GRM computed it on the (i, j <= i) pairs of every sequence: gathers of Q, K and V to [P, H, D] tensors, their
// products, a segment sum, and in the backward the same again with scatters (P = sum L (L + 1) / 2, 1.1M pairs for a
// batch of 128 histories of median 100): about 90% of a training step went to those element-wise ops and their
// [P, H, D] temporaries (benchmarks/profiling/grm_op_profile.py, benchmarks/results/grm/profile). Here each sequence is one task: a query's
// scores are dot products in registers, its output a running sum, and the backward recomputes the scores instead of
// keeping them. A sequence's values depend on that sequence only, in a fixed order (keys ascending), whatever the
// batch or the thread count. The bias gradient is summed per sequence, then added under a lock.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {
namespace {

struct Shape {
  int64_t tokens = 0, heads = 0, dim = 0, buckets = 0, sequences = 0;
};

inline int64_t Bucket(int64_t distance, int64_t buckets) {
  const int64_t log2 = 63 - __builtin_clzll(static_cast<uint64_t>(distance) + 1);
  return std::min(log2, buckets - 1);
}

inline float Dot(const float* a, const float* b, int64_t d) {
  float sum = 0.f;
  for (int64_t x = 0; x < d; ++x) sum += a[x] * b[x];
  return sum;
}

inline float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// Checks q, k, v (and dout when given) [T, H, D] of one shape, row_splits [B + 1] from 0 to T, non-decreasing, and
// bias [NB, H] (NB >= 0).
Status CheckInputs(OpKernelContext* ctx, int first_q, Shape* shape) {
  const Tensor& q = ctx->input(first_q);
  if (q.dims() != 3) {
    return errors::InvalidArgument("q must be [tokens, heads, head_dim], got shape ", q.shape().DebugString());
  }
  for (int i = 0; i < first_q + 3; ++i) {
    if (i == first_q || ctx->input(i).shape() == q.shape()) continue;
    return errors::InvalidArgument(i == 0 && first_q == 1 ? "dout" : i == first_q + 1 ? "k" : "v",
                                   " must have q's shape ", q.shape().DebugString(), ", got ",
                                   ctx->input(i).shape().DebugString());
  }
  shape->tokens = q.dim_size(0);
  shape->heads = q.dim_size(1);
  shape->dim = q.dim_size(2);
  const Tensor& splits = ctx->input(first_q + 3);
  if (!TensorShapeUtils::IsVector(splits.shape()) || splits.NumElements() < 1) {
    return errors::InvalidArgument("row_splits must be a vector of B + 1 >= 1 offsets, got shape ",
                                   splits.shape().DebugString());
  }
  const auto s = splits.flat<int64_t>();
  shape->sequences = s.size() - 1;
  if (s(0) != 0) return errors::InvalidArgument("row_splits must start at 0, got ", s(0));
  for (int64_t b = 0; b < shape->sequences; ++b) {
    if (s(b + 1) < s(b)) {
      return errors::InvalidArgument("row_splits must not decrease, got ", s(b), " then ", s(b + 1), " at position ",
                                     b + 1);
    }
  }
  if (s(shape->sequences) != shape->tokens) {
    return errors::InvalidArgument("row_splits must end at the number of tokens (", shape->tokens, "), got ",
                                   s(shape->sequences));
  }
  const Tensor& bias = ctx->input(first_q + 4);
  if (bias.dims() != 2 || (bias.dim_size(0) > 0 && bias.dim_size(1) != shape->heads)) {
    return errors::InvalidArgument("bias must be [buckets, heads] with heads = ", shape->heads, ", got shape ",
                                   bias.shape().DebugString());
  }
  shape->buckets = bias.dim_size(0);
  return OkStatus();
}

// Runs task(b) for every sequence on the intra-op pool, the sequences split into ranges of about equal pairs.
template <typename Task>
void OverSequences(OpKernelContext* ctx, const int64_t* splits, const Shape& shape, Task task) {
  int64_t pairs = 0;
  for (int64_t b = 0; b < shape.sequences; ++b) {
    const int64_t n = splits[b + 1] - splits[b];
    pairs += n * (n + 1) / 2;
  }
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(ctx), shape.sequences));
  if (threads == 1 || pairs * shape.heads * shape.dim < (int64_t{1} << 16)) {
    for (int64_t b = 0; b < shape.sequences; ++b) task(b);
    return;
  }
  // Contiguous ranges of sequences holding about pairs / threads pairs each.
  std::vector<int64_t> bounds = {0};
  int64_t seen = 0;
  for (int64_t b = 0; b < shape.sequences; ++b) {
    const int64_t n = splits[b + 1] - splits[b];
    seen += n * (n + 1) / 2;
    if (seen * threads >= pairs * static_cast<int64_t>(bounds.size()) && b + 1 < shape.sequences) {
      bounds.push_back(b + 1);
    }
  }
  bounds.push_back(shape.sequences);
  CpuRunner(ctx)(static_cast<int64_t>(bounds.size()) - 1, [&](int64_t t) {
    for (int64_t b = bounds[t]; b < bounds[t + 1]; ++b) task(b);
  });
}

// Both kernels' attribute: the fixed normaliser n_i (0: the causal one, i + 1).
class AttentionKernel : public OpKernel {
 public:
  explicit AttentionKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fixed_norm", &fixed_norm_));
    OP_REQUIRES(ctx, fixed_norm_ >= 0, errors::InvalidArgument("fixed_norm must be >= 0, got ", fixed_norm_));
  }

 protected:
  int64_t fixed_norm_ = 0;
};

class RaggedCausalAttentionOp : public AttentionKernel {
 public:
  using AttentionKernel::AttentionKernel;

  void Compute(OpKernelContext* ctx) override {
    Shape shape;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 0, &shape));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &out));
    const float* q = ctx->input(0).flat<float>().data();
    const float* k = ctx->input(1).flat<float>().data();
    const float* v = ctx->input(2).flat<float>().data();
    const int64_t* splits = ctx->input(3).flat<int64_t>().data();
    const float* bias = ctx->input(4).flat<float>().data();
    float* o = out->flat<float>().data();
    const int64_t h = shape.heads, d = shape.dim, row = h * d, nb = shape.buckets;
    const int64_t fixed = fixed_norm_;
    OverSequences(ctx, splits, shape, [&](int64_t b) {
      const int64_t start = splits[b], length = splits[b + 1] - start;
      for (int64_t i = 0; i < length; ++i) {
        const float norm = static_cast<float>(fixed > 0 ? fixed : i + 1);
        for (int64_t head = 0; head < h; ++head) {
          const float* qi = q + (start + i) * row + head * d;
          float* oi = o + (start + i) * row + head * d;
          std::fill(oi, oi + d, 0.f);
          for (int64_t j = 0; j <= i; ++j) {
            float score = Dot(qi, k + (start + j) * row + head * d, d);
            if (nb > 0) score += bias[Bucket(i - j, nb) * h + head];
            const float weight = score * Sigmoid(score) / norm;
            const float* vj = v + (start + j) * row + head * d;
            for (int64_t x = 0; x < d; ++x) oi[x] += weight * vj[x];
          }
        }
      }
    });
  }

};

class RaggedCausalAttentionGradOp : public AttentionKernel {
 public:
  using AttentionKernel::AttentionKernel;

  void Compute(OpKernelContext* ctx) override {
    Shape shape;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 1, &shape));
    Tensor *dq_t = nullptr, *dk_t = nullptr, *dv_t = nullptr, *dbias_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ctx->input(1).shape(), &dq_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, ctx->input(1).shape(), &dk_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(1).shape(), &dv_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, ctx->input(5).shape(), &dbias_t));
    const float* dout = ctx->input(0).flat<float>().data();
    const float* q = ctx->input(1).flat<float>().data();
    const float* k = ctx->input(2).flat<float>().data();
    const float* v = ctx->input(3).flat<float>().data();
    const int64_t* splits = ctx->input(4).flat<int64_t>().data();
    const float* bias = ctx->input(5).flat<float>().data();
    float* dq = dq_t->flat<float>().data();
    float* dk = dk_t->flat<float>().data();
    float* dv = dv_t->flat<float>().data();
    float* dbias = dbias_t->flat<float>().data();
    const int64_t h = shape.heads, d = shape.dim, row = h * d, nb = shape.buckets;
    const int64_t fixed = fixed_norm_;
    std::fill(dbias, dbias + dbias_t->NumElements(), 0.f);
    std::mutex dbias_mutex;
    OverSequences(ctx, splits, shape, [&](int64_t b) {
      const int64_t start = splits[b], length = splits[b + 1] - start;
      std::fill(dq + start * row, dq + (start + length) * row, 0.f);
      std::fill(dk + start * row, dk + (start + length) * row, 0.f);
      std::fill(dv + start * row, dv + (start + length) * row, 0.f);
      std::vector<float> local(nb * h, 0.f);
      for (int64_t i = 0; i < length; ++i) {
        const float norm = static_cast<float>(fixed > 0 ? fixed : i + 1);
        for (int64_t head = 0; head < h; ++head) {
          const int64_t at_i = (start + i) * row + head * d;
          const float* qi = q + at_i;
          const float* gi = dout + at_i;
          float* dqi = dq + at_i;
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t at_j = (start + j) * row + head * d;
            const int64_t bucket = nb > 0 ? Bucket(i - j, nb) : 0;
            float score = Dot(qi, k + at_j, d);
            if (nb > 0) score += bias[bucket * h + head];
            const float sig = Sigmoid(score);
            const float weight = score * sig / norm;
            float* dvj = dv + at_j;
            for (int64_t x = 0; x < d; ++x) dvj[x] += weight * gi[x];
            // d weight / d score = SiLU'(score) / n_i = sig (1 + score (1 - sig)) / n_i.
            const float ds = Dot(gi, v + at_j, d) * sig * (1.f + score * (1.f - sig)) / norm;
            const float* kj = k + at_j;
            float* dkj = dk + at_j;
            for (int64_t x = 0; x < d; ++x) {
              dqi[x] += ds * kj[x];
              dkj[x] += ds * qi[x];
            }
            if (nb > 0) local[bucket * h + head] += ds;
          }
        }
      }
      if (nb > 0) {
        std::lock_guard<std::mutex> lock(dbias_mutex);
        for (int64_t x = 0; x < nb * h; ++x) dbias[x] += local[x];
      }
    });
  }

};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("FusedRec>RaggedCausalAttention").Device(DEVICE_CPU), RaggedCausalAttentionOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>RaggedCausalAttentionGrad").Device(DEVICE_CPU), RaggedCausalAttentionGradOp);

}  // namespace fusedrec
}  // namespace tensorflow

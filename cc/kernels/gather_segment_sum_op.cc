/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// GatherSegmentSum replaces, in a fused group lookup's output, the chain gather (recover) -> split per feature ->
// unsorted_segment_sum (combiner) or scatter_nd (one row per id), and its gradient the chain gather -> concat ->
// unsorted_segment_sum: each pass touched every row of the group, in ops that each cost a dispatch per feature.
#include "cc/kernels/gather_segment_sum_op.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// Ids (times dim) per task below which one thread does the whole pass: a task costs more than it saves.
constexpr int64_t kMinWorkPerTask = 1 << 16;

// to[k] += from[k], element by element in float arithmetic of T (as Eigen's SumOp in unsorted_segment_sum).
template <typename T>
inline void AddRow(T* to, const T* from, int64_t dim) {
  for (int64_t k = 0; k < dim; ++k) to[k] += from[k];
}

int64_t Tasks(OpKernelContext* ctx, int64_t work, int64_t most) {
  return std::max<int64_t>(1, std::min<int64_t>({int64_t{NumCpuThreads(ctx)}, work / kMinWorkPerTask, most}));
}

}  // namespace

template <typename T>
struct GatherSegmentSumFunctor<CPUDevice, T> {
  void operator()(OpKernelContext* ctx, const T* params, int64_t dim, const std::vector<SegmentSpan<T, T>>& features) {
    // Features write disjoint outputs: one task per feature keeps every output row's sum in id order.
    auto feature = [&](int64_t f) {
      const SegmentSpan<T, T>& s = features[f];
      std::fill(s.rows, s.rows + s.num_segments * dim, T(0));
      for (int64_t j = 0; j < s.n; ++j) AddRow(s.rows + s.segments[j] * dim, params + int64_t{s.index[j]} * dim, dim);
    };
    int64_t work = 0;
    for (const auto& s : features) work += (s.n + s.num_segments) * dim;
    const int64_t num_features = static_cast<int64_t>(features.size());
    if (Tasks(ctx, work, num_features) == 1) {
      for (int64_t f = 0; f < num_features; ++f) feature(f);
    } else {
      CpuRunner(ctx)(num_features, feature);
    }
  }
};

template <typename T>
struct GatherSegmentSumGradFunctor<CPUDevice, T> {
  void operator()(OpKernelContext* ctx, const std::vector<SegmentSpan<T, const T>>& features, int64_t dim,
                  T* params_grad, int64_t num_params) {
    // Several features add into one params row: a task owns a range of params rows and scans every id in order, so
    // each row's sum keeps the chain's order whatever the number of tasks.
    int64_t n = 0;
    for (const auto& s : features) n += s.n;
    const int64_t tasks = Tasks(ctx, (n + num_params) * dim, num_params);
    const int64_t len = (num_params + tasks - 1) / std::max<int64_t>(tasks, 1);
    auto range = [&](int64_t t) {
      const int64_t lo = t * len, hi = std::min(num_params, (t + 1) * len);
      if (lo >= hi) return;
      std::fill(params_grad + lo * dim, params_grad + hi * dim, T(0));
      for (const auto& s : features) {
        for (int64_t j = 0; j < s.n; ++j) {
          const int64_t row = s.index[j];
          if (row >= lo && row < hi) AddRow(params_grad + row * dim, s.rows + s.segments[j] * dim, dim);
        }
      }
    };
    if (tasks == 1) {
      range(0);
    } else {
      CpuRunner(ctx)(tasks, range);
    }
  }
};

namespace {

// The checks both ops share: index a vector whose length is the sum of the segment_ids' lengths, every index in
// [0, num_params), every segment id of feature f in [0, num_segments[f]). Fills the spans' index, segments, n and
// num_segments.
template <typename T, typename Rows>
Status CheckSegments(OpKernelContext* ctx, const Tensor& index, const OpInputList& segment_ids,
                     const OpInputList& num_segments, int64_t num_params, std::vector<SegmentSpan<T, Rows>>* spans) {
  TF_RETURN_IF_ERROR(CheckVector(index, "index"));
  const int64_t n = index.NumElements();
  const int32* idx = index.flat<int32>().data();
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= num_params) {
      return errors::InvalidArgument("index must be in [0, ", num_params, ") (the rows of params), got ", idx[i],
                                     " at position ", i);
    }
  }
  int64_t offset = 0;
  spans->resize(segment_ids.size());
  for (int f = 0; f < segment_ids.size(); ++f) {
    const Tensor& seg = segment_ids[f];
    if (!TensorShapeUtils::IsVector(seg.shape())) {
      return errors::InvalidArgument("segment_ids[", f, "] must be a vector (rank 1), got shape ",
                                     seg.shape().DebugString());
    }
    if (!TensorShapeUtils::IsScalar(num_segments[f].shape())) {
      return errors::InvalidArgument("num_segments[", f, "] must be a scalar, got shape ",
                                     num_segments[f].shape().DebugString());
    }
    const int64_t size = num_segments[f].scalar<int64>()();
    if (size < 0) return errors::InvalidArgument("num_segments[", f, "] must be >= 0, got ", size);
    const int64_t count = seg.NumElements();
    if (offset + count > n) {
      return errors::InvalidArgument("segment_ids hold more ids than index (", n, "): segment_ids[", f,
                                     "] ends at ", offset + count);
    }
    const int64* s = seg.flat<int64>().data();
    for (int64_t j = 0; j < count; ++j) {
      if (s[j] < 0 || s[j] >= size) {
        return errors::InvalidArgument("segment_ids[", f, "] must be in [0, ", size, ") (num_segments[", f,
                                       "]), got ", s[j], " at position ", j);
      }
    }
    (*spans)[f] = SegmentSpan<T, Rows>{idx + offset, s, count, nullptr, size};
    offset += count;
  }
  if (offset != n) {
    return errors::InvalidArgument("index has ", n, " entries but segment_ids hold ", offset,
                                   " ids: they must be equal");
  }
  return OkStatus();
}

}  // namespace

template <typename Device, typename T>
class GatherSegmentSumOp : public OpKernel {
 public:
  explicit GatherSegmentSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(params.shape()),
                errors::InvalidArgument("params must be a matrix [rows, dim], got shape ",
                                        params.shape().DebugString()));
    OpInputList segment_ids, num_segments;
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segment_ids));
    OP_REQUIRES_OK(ctx, ctx->input_list("num_segments", &num_segments));
    std::vector<SegmentSpan<T, T>> spans;
    OP_REQUIRES_OK(ctx, CheckSegments(ctx, ctx->input(1), segment_ids, num_segments, params.dim_size(0), &spans));
    const int64_t dim = params.dim_size(1);
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("outputs", &outputs));
    for (int f = 0; f < outputs.size(); ++f) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(f, TensorShape({spans[f].num_segments, dim}), &out));
      spans[f].rows = out->flat<T>().data();
    }
    GatherSegmentSumFunctor<Device, T>()(ctx, params.flat<T>().data(), dim, spans);
  }
};

template <typename Device, typename T>
class GatherSegmentSumGradOp : public OpKernel {
 public:
  explicit GatherSegmentSumGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads, segment_ids, num_segments;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, ctx->input_list("segment_ids", &segment_ids));
    OP_REQUIRES_OK(ctx, ctx->input_list("num_segments", &num_segments));
    const Tensor& num_params_t = ctx->input(3 * grads.size() + 1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(num_params_t.shape()),
                errors::InvalidArgument("num_params must be a scalar, got shape ",
                                        num_params_t.shape().DebugString()));
    const int64_t num_params = num_params_t.scalar<int32>()();
    OP_REQUIRES(ctx, num_params >= 0, errors::InvalidArgument("num_params must be >= 0, got ", num_params));
    std::vector<SegmentSpan<T, const T>> spans;
    OP_REQUIRES_OK(ctx, CheckSegments(ctx, ctx->input(grads.size()), segment_ids, num_segments, num_params, &spans));
    int64_t dim = -1;
    for (int f = 0; f < grads.size(); ++f) {
      const Tensor& g = grads[f];
      OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(g.shape()) && g.dim_size(0) == spans[f].num_segments,
                  errors::InvalidArgument("grads[", f, "] must have shape [", spans[f].num_segments,
                                          ", dim] (num_segments[", f, "] rows), got ", g.shape().DebugString()));
      OP_REQUIRES(ctx, dim < 0 || g.dim_size(1) == dim,
                  errors::InvalidArgument("grads[", f, "] has dim ", g.dim_size(1), ", grads[0] has ", dim));
      dim = g.dim_size(1);
      spans[f].rows = g.flat<T>().data();
    }
    Tensor* params_grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_params, dim}), &params_grad));
    GatherSegmentSumGradFunctor<Device, T>()(ctx, spans, dim, params_grad->flat<T>().data(), num_params);
  }
};

#define REGISTER_CPU(T)                                                                                     \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>GatherSegmentSum").Device(DEVICE_CPU).TypeConstraint<T>("T"),      \
                          GatherSegmentSumOp<CPUDevice, T>);                                                \
  REGISTER_KERNEL_BUILDER(Name("FusedRec>GatherSegmentSumGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),  \
                          GatherSegmentSumGradOp<CPUDevice, T>);
REGISTER_CPU(Eigen::half);
REGISTER_CPU(float);
REGISTER_CPU(double);
#undef REGISTER_CPU

}  // namespace fusedrec
}  // namespace tensorflow

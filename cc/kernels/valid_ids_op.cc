/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// ValidIds and IdExtremes: the layer's input preparation over all features at once. Per feature the layer ran
// GreaterEqual, Where, Reshape and GatherV2 to keep the ids >= 0 and their positions, and a Min and a Max (then a
// Pack of each) for its value checks: about six executor nodes per feature, 26 features in criteo_synthetic, where
// the work is a pass over a few thousand ids. Here each is one node and one pass per feature.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {

class ValidIdsOp : public OpKernel {
 public:
  explicit ValidIdsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    OpOutputList valid, positions;
    OP_REQUIRES_OK(ctx, ctx->output_list("valid", &valid));
    OP_REQUIRES_OK(ctx, ctx->output_list("positions", &positions));
    for (int i = 0; i < ids.size(); ++i) {
      const int64_t n = ids[i].NumElements();
      const int64_t* x = ids[i].unaligned_flat<int64_t>().data();
      int64_t count = 0;
      for (int64_t j = 0; j < n; ++j) count += x[j] >= 0;
      Tensor *v = nullptr, *p = nullptr;
      OP_REQUIRES_OK(ctx, valid.allocate(i, TensorShape({count}), &v));
      OP_REQUIRES_OK(ctx, positions.allocate(i, TensorShape({count}), &p));
      int64_t* vo = v->flat<int64_t>().data();
      int64_t* po = p->flat<int64_t>().data();
      if (count == n) {  // no padding (one-hot features): every id, every position
        std::copy(x, x + n, vo);
        for (int64_t j = 0; j < n; ++j) po[j] = j;
        continue;
      }
      int64_t k = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (x[j] >= 0) {
          vo[k] = x[j];
          po[k] = j;
          ++k;
        }
      }
    }
  }
};

class IdExtremesOp : public OpKernel {
 public:
  explicit IdExtremesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    Tensor *lows = nullptr, *highs = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({ids.size()}), &lows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({ids.size()}), &highs));
    int64_t* lo = lows->flat<int64_t>().data();
    int64_t* hi = highs->flat<int64_t>().data();
    for (int i = 0; i < ids.size(); ++i) {
      const int64_t n = ids[i].NumElements();
      const int64_t* x = ids[i].unaligned_flat<int64_t>().data();
      // Four independent lanes: one running min/max is a chain of dependent compares (about 1.3 ns an id).
      int64_t low[4], high[4];
      std::fill(low, low + 4, std::numeric_limits<int64_t>::max());
      std::fill(high, high + 4, std::numeric_limits<int64_t>::min());
      int64_t j = 0;
      for (; j + 4 <= n; j += 4) {
        for (int k = 0; k < 4; ++k) {
          low[k] = std::min(low[k], x[j + k]);
          high[k] = std::max(high[k], x[j + k]);
        }
      }
      for (; j < n; ++j) {
        low[0] = std::min(low[0], x[j]);
        high[0] = std::max(high[0], x[j]);
      }
      lo[i] = *std::min_element(low, low + 4);
      hi[i] = *std::max_element(high, high + 4);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("FusedRec>ValidIds").Device(DEVICE_CPU), ValidIdsOp);
REGISTER_KERNEL_BUILDER(Name("FusedRec>IdExtremes").Device(DEVICE_CPU), IdExtremesOp);

}  // namespace fusedrec
}  // namespace tensorflow

/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// FuseIds: the sender's first step, a group's per-feature ids as one key list with each key's category. The layer
// built it from a ConcatV2 of the ids, a Size per feature and their Pack, and a repeat of the categories (RowIds and
// a GatherV2 over every key): here one op copies each feature's ids and fills its category beside them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace fusedrec {

class FuseIdsOp : public OpKernel {
 public:
  explicit FuseIdsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int n = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("categories", &categories_));
    OP_REQUIRES(ctx, static_cast<int>(categories_.size()) == n,
                errors::InvalidArgument("categories must hold one category per ids tensor: ", n, " tensors, ",
                                        categories_.size(), " categories"));
    for (size_t i = 0; i < categories_.size(); ++i) {
      OP_REQUIRES(ctx, categories_[i] >= 0 && categories_[i] <= std::numeric_limits<int32>::max(),
                  errors::InvalidArgument("categories[", i, "] must be in [0, 2^31), got ", categories_[i]));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    int64_t total = 0;
    for (int i = 0; i < ids.size(); ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsVector(ids[i].shape()),
                  errors::InvalidArgument("ids[", i, "] must be a vector, got shape ", ids[i].shape().DebugString()));
      total += ids[i].NumElements();
    }
    OP_REQUIRES(ctx, total <= std::numeric_limits<int32>::max(),
                errors::InvalidArgument("the group's ids must number below 2^31 (int32 positions), got ", total));
    Tensor *keys = nullptr, *segments = nullptr, *sizes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &segments));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({ids.size()}), &sizes));
    int64_t* k = keys->flat<int64_t>().data();
    int32* s = segments->flat<int32>().data();
    int32* f = sizes->flat<int32>().data();
    for (int i = 0; i < ids.size(); ++i) {
      const int64_t n = ids[i].NumElements();
      if (n > 0) std::memcpy(k, ids[i].flat<int64_t>().data(), n * sizeof(int64_t));
      std::fill(s, s + n, static_cast<int32>(categories_[i]));
      f[i] = static_cast<int32>(n);
      k += n;
      s += n;
    }
  }

 private:
  std::vector<int64_t> categories_;
};

REGISTER_KERNEL_BUILDER(Name("FusedRec>FuseIds").Device(DEVICE_CPU), FuseIdsOp);

}  // namespace fusedrec
}  // namespace tensorflow

/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
// FusedRec>HashedRows: Hashed initial rows of ids, with the native table's own initializer (impl/native_table.h),
// so the TFRA backend, the per-feature layer and the native table start a new key from the same row.
#include <algorithm>
#include <cmath>

#include "cc/kernels/impl/native_table.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {
namespace {

// Rows per shard of the CPU pool; below this one thread does all the work.
constexpr int64_t kMinRowsPerShard = 1 << 12;

class HashedRowsOp : public OpKernel {
 public:
  explicit HashedRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) { OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_)); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    const Tensor& salts = ctx->input(1);
    const Tensor& stddev = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckVector(ids, "ids"));
    OP_REQUIRES_OK(ctx, CheckVector(salts, "salts"));
    OP_REQUIRES(ctx, ids.NumElements() == salts.NumElements(),
                errors::InvalidArgument("ids and salts must have the same length, got ", ids.NumElements(),
                                        " ids and ", salts.NumElements(), " salts"));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(stddev.shape()),
                errors::InvalidArgument("stddev must be a scalar, got shape ", stddev.shape().DebugString()));
    const double sd = stddev.scalar<double>()();
    OP_REQUIRES(ctx, std::isfinite(sd) && sd > 0, errors::InvalidArgument("stddev must be finite and > 0, got ", sd));
    const int64_t n = ids.NumElements();
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &rows));
    const int64_t* id = ids.flat<int64_t>().data();
    const int64_t* salt = salts.flat<int64_t>().data();
    float* out = rows->flat<float>().data();
    const impl::HashedInitializer init(sd);
    const int64_t dim = dim_;
    const int64_t shards = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(ctx), n / kMinRowsPerShard));
    const int64_t len = (n + shards - 1) / shards;
    CpuRunner(ctx)(shards, [&](int64_t s) {
      for (int64_t i = s * len, e = std::min(n, (s + 1) * len); i < e; ++i) init.Fill(id[i], salt[i], dim, out + i * dim);
    });
  }

 private:
  int64_t dim_;
};

REGISTER_KERNEL_BUILDER(Name("FusedRec>HashedRows").Device(DEVICE_CPU), HashedRowsOp);

}  // namespace
}  // namespace fusedrec
}  // namespace tensorflow

/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#include "cc/kernels/fused_sender_op.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cc/kernels/impl/hashing.h"
#include "cc/kernels/impl/pair_dedup.h"
#include "cc/kernels/kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tensorflow {
namespace fusedrec {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

// Fused positions per task of the recover-index pass; below twice this one thread does it.
constexpr int64_t kMinShard = 1 << 14;

Status UnpackableKeyError(int64_t key, int32_t segment, int64_t num_segments, int key_bits) {
  return errors::InvalidArgument("key ", key, " of segment ", segment, " cannot be sent packed: with num_segments=",
                                 num_segments, " the packed wire holds keys in [0, 2^", key_bits,
                                 "); use encoding='hashed' for ids that need more bits or are negative");
}

// Send-buffer position of each unique pair: a per-thread buffer kept between calls, as the dedup's are.
std::vector<int32_t>& ThreadPositions() {
  static thread_local std::vector<int32_t> positions;
  return positions;
}

}  // namespace

template <typename K>
struct FusedSenderFunctor<CPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_ranks,
                    int64_t num_segments, SenderWire wire) {
    return WithUniquePairs<K>(ctx, keys, segment_ids, /*inverse_index=*/2, [&](const impl::PairSet<K>& unique) {
      std::vector<int32_t>& positions = ThreadPositions();
      const Status status = Route(ctx, unique, num_ranks, num_segments, wire, &positions);
      if (positions.capacity() > impl::kMaxRetainedSlots) std::vector<int32_t>().swap(positions);
      return status;
    });
  }

  // The partition and the encoding work on the unique pairs (few next to N); only the last pass, which turns the
  // dedup's inverse (already in output 2) into the recover index, runs over every fused position.
  static Status Route(OpKernelContext* ctx, const impl::PairSet<K>& unique, int64_t num_ranks, int64_t num_segments,
                      SenderWire wire, std::vector<int32_t>* positions) {
    const int64_t u = unique.size();
    const bool packed = wire == SenderWire::kPacked;
    const int key_bits = 63 - impl::PackedSegmentBits(num_segments);
    const int64_t key_limit = int64_t{1} << key_bits;
    Tensor *message = nullptr, *splits = nullptr, *segment_counts = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, packed ? TensorShape({u}) : TensorShape({u, 2}), &message));
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({num_ranks}), &splits));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({num_segments}), &segment_counts));
    auto split = splits->flat<int32>();
    auto counts = segment_counts->flat<int64>();
    split.setZero();
    counts.setZero();

    // Pass 1: the owner of every unique pair (held in `positions` until pass 2), per-rank and per-segment counts.
    positions->resize(u);
    int32_t* pos = positions->data();
    for (int64_t j = 0; j < u; ++j) {
      const auto& e = unique.entries[j];
      const int64_t key = static_cast<int64_t>(e.key);
      if (packed && (key < 0 || key >= key_limit)) return UnpackableKeyError(key, e.segment, num_segments, key_bits);
      pos[j] = impl::OwnerOf(key, static_cast<uint64_t>(num_ranks));
      ++split(pos[j]);
      ++counts(e.segment);
    }
    std::vector<int64_t> next(num_ranks);
    for (int64_t r = 0, running = 0; r < num_ranks; ++r) {
      next[r] = running;
      running += split(r);
    }

    // Pass 2: a stable scatter by owner (PartitionByOwner's order), encoding each pair where it lands.
    int64* out = message->flat<int64>().data();
    for (int64_t j = 0; j < u; ++j) {
      const auto& e = unique.entries[j];
      const int64_t p = next[pos[j]]++;
      pos[j] = static_cast<int32_t>(p);
      const int64_t key = static_cast<int64_t>(e.key);
      if (packed) {
        out[p] = impl::PackedUnifiedKey(key, e.segment, key_bits);
      } else {
        out[2 * p] = key;
        out[2 * p + 1] = e.segment;
      }
    }

    // Pass 3: recover_index[i] = send-buffer position of fused position i's pair.
    int32* recover = ctx->mutable_output(2)->flat<int32>().data();
    const int64_t n = ctx->mutable_output(2)->NumElements();
    ParallelRanges(ctx, n, kMinShard, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) recover[i] = pos[recover[i]];
    });
    return OkStatus();
  }
};

template <typename Device, typename K>
class FusedSenderOp : public OpKernel {
 public:
  explicit FusedSenderOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_ranks", &num_ranks_));
    OP_REQUIRES(ctx, num_ranks_ >= 1, errors::InvalidArgument("num_ranks must be >= 1, got ", num_ranks_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_segments", &num_segments_));
    OP_REQUIRES(ctx, num_segments_ >= 1,
                errors::InvalidArgument("num_segments must be >= 1, got ", num_segments_));
    std::string wire;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wire", &wire));
    if (wire == "packed") {
      wire_ = SenderWire::kPacked;
    } else if (wire == "pair") {
      wire_ = SenderWire::kPair;
    } else {
      ctx->CtxFailure(errors::InvalidArgument("wire must be 'packed' or 'pair', got '", wire, "'"));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& segment_ids = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysAndSegments(keys, segment_ids));
    OP_REQUIRES_OK(ctx, CheckSegmentRange(segment_ids, num_segments_));
    OP_REQUIRES_OK(ctx, (FusedSenderFunctor<Device, K>()(ctx, keys, segment_ids, num_ranks_, num_segments_, wire_)));
  }

 private:
  int64_t num_ranks_;
  int64_t num_segments_;
  SenderWire wire_ = SenderWire::kPacked;
};

#define REGISTER_CPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>FusedSender").Device(DEVICE_CPU).TypeConstraint<K>("T"),            \
      FusedSenderOp<CPUDevice, K>);
REGISTER_CPU(int32);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

}  // namespace fusedrec
}  // namespace tensorflow

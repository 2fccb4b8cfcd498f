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
#include "tensorflow/core/framework/tensor_shape.h"

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

// The first of the n sorted values at `first` that is not below `value` (first + n if none): std::lower_bound's
// answer without its data-dependent branch, which a search among random keys mispredicts at about every other level
// (measured: 47 ns per search of 2,000 hot keys with std::lower_bound, most of FusedSenderHot's time).
inline const int64* BranchlessLowerBound(const int64* first, int64_t n, int64_t value) {
  if (n == 0) return first;
  const int64* base = first;
  while (n > 1) {  // the answer lies in [base, base + n]
    const int64_t half = n / 2;
    base = base[half] < value ? base + half : base;
    n -= half;
  }
  return base + (*base < value);
}

// Send-buffer position of each unique pair: a per-thread buffer kept between calls, as the dedup's are.
std::vector<int32_t>& ThreadPositions() {
  static thread_local std::vector<int32_t> positions;
  return positions;
}

// Each hot pair's position in hot_keys (FusedSenderHot), collected before its output can be allocated.
std::vector<int32_t>& ThreadHotPositions() {
  static thread_local std::vector<int32_t> positions;
  return positions;
}

}  // namespace

template <typename K>
struct FusedSenderFunctor<CPUDevice, K> {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_ranks,
                    int64_t num_segments, SenderWire wire, const Tensor* hot_keys) {
    return WithUniquePairs<K>(ctx, keys, segment_ids, /*inverse_index=*/2, [&](const impl::PairSet<K>& unique) {
      std::vector<int32_t>& positions = ThreadPositions();
      std::vector<int32_t>& hot_positions = ThreadHotPositions();
      const Status status = Route(ctx, unique, num_ranks, num_segments, wire, hot_keys, &positions, &hot_positions);
      if (positions.capacity() > impl::kMaxRetainedSlots) std::vector<int32_t>().swap(positions);
      if (hot_positions.capacity() > impl::kMaxRetainedSlots) std::vector<int32_t>().swap(hot_positions);
      return status;
    });
  }

  // The partition and the encoding work on the unique pairs (few next to N); only the last pass, which turns the
  // dedup's inverse (already in output 2) into the recover index, runs over every fused position.
  //
  // hot_keys (FusedSenderHot; nullptr for FusedSender): sorted unified keys of a replicated hot set. A unique pair
  // whose unified key (the packed message word, or HashedUnifiedKey for the pair wire) is among them is not sent:
  // its recover index points past the message (message length + its rank among the hot pairs, first-occurrence
  // order), its position in hot_keys goes to output 4, and it counts in no split or segment count.
  static Status Route(OpKernelContext* ctx, const impl::PairSet<K>& unique, int64_t num_ranks, int64_t num_segments,
                      SenderWire wire, const Tensor* hot_keys, std::vector<int32_t>* positions,
                      std::vector<int32_t>* hot_positions) {
    const int64_t u = unique.size();
    const bool packed = wire == SenderWire::kPacked;
    const int key_bits = 63 - impl::PackedSegmentBits(num_segments);
    const int64_t key_limit = int64_t{1} << key_bits;
    const int64* hot_begin = hot_keys == nullptr ? nullptr : hot_keys->flat<int64>().data();
    const int64* hot_end = hot_keys == nullptr ? nullptr : hot_begin + hot_keys->NumElements();
    Tensor *splits = nullptr, *segment_counts = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({num_ranks}), &splits));
    TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({num_segments}), &segment_counts));
    auto split = splits->flat<int32>();
    auto counts = segment_counts->flat<int64>();
    split.setZero();
    counts.setZero();

    // Pass 1: the owner of every sent unique pair, or -(its rank among the hot pairs) - 1 for a hot one (held in
    // `positions` until pass 2); per-rank and per-segment counts of the sent pairs.
    positions->resize(u);
    hot_positions->clear();
    int32_t* pos = positions->data();
    for (int64_t j = 0; j < u; ++j) {
      const auto& e = unique.entries[j];
      const int64_t key = static_cast<int64_t>(e.key);
      if (packed && (key < 0 || key >= key_limit)) return UnpackableKeyError(key, e.segment, num_segments, key_bits);
      if (hot_begin != hot_end) {
        const int64_t unified =
            packed ? impl::PackedUnifiedKey(key, e.segment, key_bits) : impl::HashedUnifiedKey(key, e.segment);
        const int64* at = BranchlessLowerBound(hot_begin, hot_end - hot_begin, unified);
        if (at != hot_end && *at == unified) {
          pos[j] = -1 - static_cast<int32_t>(hot_positions->size());
          hot_positions->push_back(static_cast<int32_t>(at - hot_begin));
          continue;
        }
      }
      pos[j] = impl::OwnerOf(key, static_cast<uint64_t>(num_ranks));
      ++split(pos[j]);
      ++counts(e.segment);
    }
    const int64_t num_hot = static_cast<int64_t>(hot_positions->size());
    const int64_t sent = u - num_hot;
    Tensor* message = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, packed ? TensorShape({sent}) : TensorShape({sent, 2}), &message));
    if (hot_keys != nullptr) {
      Tensor* hot_position = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(4, TensorShape({num_hot}), &hot_position));
      std::copy(hot_positions->begin(), hot_positions->end(), hot_position->flat<int32>().data());
    }
    std::vector<int64_t> next(num_ranks);
    for (int64_t r = 0, running = 0; r < num_ranks; ++r) {
      next[r] = running;
      running += split(r);
    }

    // Pass 2: a stable scatter by owner (PartitionByOwner's order), encoding each sent pair where it lands; a hot
    // pair's place is after the message.
    int64* out = message->flat<int64>().data();
    for (int64_t j = 0; j < u; ++j) {
      if (pos[j] < 0) {
        pos[j] = static_cast<int32_t>(sent - 1 - pos[j]);  // sent + its rank among the hot pairs (-1 - pos[j])
        continue;
      }
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

template <typename Device, typename K, bool kHot>
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
    const Tensor* hot_keys = nullptr;
    if (kHot) {
      hot_keys = &ctx->input(2);
      OP_REQUIRES(ctx, TensorShapeUtils::IsVector(hot_keys->shape()),
                  errors::InvalidArgument("hot_keys must be a vector, got shape ", hot_keys->shape().DebugString()));
      const auto hot = hot_keys->flat<int64>();
      for (int64_t i = 1; i < hot.size(); ++i) {
        OP_REQUIRES(ctx, hot(i - 1) < hot(i),
                    errors::InvalidArgument("hot_keys must be sorted ascending without repeats: hot_keys[", i - 1,
                                            "] = ", hot(i - 1), ", hot_keys[", i, "] = ", hot(i)));
      }
      OP_REQUIRES_OK(ctx, CheckFeatureSizes(ctx->input(3), keys.NumElements()));
    }
    OP_REQUIRES_OK(ctx, (FusedSenderFunctor<Device, K>()(ctx, keys, segment_ids, num_ranks_, num_segments_, wire_,
                                                         hot_keys)));
    if (kHot) OP_REQUIRES_OK(ctx, CountHotHits(ctx, ctx->input(3)));
  }

 private:
  // feature_sizes: int32 [F], the fused positions of each feature in order; they must cover the keys exactly.
  static Status CheckFeatureSizes(const Tensor& feature_sizes, int64_t n) {
    if (!TensorShapeUtils::IsVector(feature_sizes.shape())) {
      return errors::InvalidArgument("feature_sizes must be a vector, got shape ",
                                     feature_sizes.shape().DebugString());
    }
    const auto sizes = feature_sizes.flat<int32>();
    int64_t total = 0;
    for (int64_t f = 0; f < sizes.size(); ++f) {
      if (sizes(f) < 0) return errors::InvalidArgument("feature_sizes[", f, "] = ", sizes(f), " is negative");
      total += sizes(f);
    }
    if (total != n) {
      return errors::InvalidArgument("feature_sizes sum to ", total, " but keys has ", n, " positions");
    }
    return OkStatus();
  }

  // Output 5, hot_hits[f]: feature f's fused positions whose pair is hot (recover index past the message).
  static Status CountHotHits(OpKernelContext* ctx, const Tensor& feature_sizes) {
    const auto sizes = feature_sizes.flat<int32>();
    Tensor* hot_hits = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(5, TensorShape({sizes.size()}), &hot_hits));
    const int32* recover = ctx->mutable_output(2)->flat<int32>().data();
    const int64_t sent = ctx->mutable_output(0)->dim_size(0);
    auto hits = hot_hits->flat<int64>();
    for (int64_t f = 0, i = 0; f < sizes.size(); ++f) {
      int64_t count = 0;
      for (const int64_t end = i + sizes(f); i < end; ++i) count += recover[i] >= sent;
      hits(f) = count;
    }
    return OkStatus();
  }

  int64_t num_ranks_;
  int64_t num_segments_;
  SenderWire wire_ = SenderWire::kPacked;
};

#define REGISTER_CPU(K)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>FusedSender").Device(DEVICE_CPU).TypeConstraint<K>("T"),            \
      FusedSenderOp<CPUDevice, K, false>);                                               \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("FusedRec>FusedSenderHot").Device(DEVICE_CPU).TypeConstraint<K>("T"),         \
      FusedSenderOp<CPUDevice, K, true>);
REGISTER_CPU(int32);
REGISTER_CPU(int64_t);
#undef REGISTER_CPU

}  // namespace fusedrec
}  // namespace tensorflow

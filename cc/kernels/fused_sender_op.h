/* Copyright 2026 The tf_fusedrec Authors. Licensed under the Apache License, Version 2.0. */
#ifndef CC_KERNELS_FUSED_SENDER_OP_H_
#define CC_KERNELS_FUSED_SENDER_OP_H_

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace fusedrec {

// How a (segment, key) pair travels in the keys all-to-all: one packed int64 (segment << key_bits) | key, or an
// int64 [2] row (key, segment).
enum class SenderWire { kPacked, kPair };

// The sender side of a group lookup in one pass: unique (segment, key) pairs, stably partitioned by OwnerOf(key),
// encoded for the wire. Allocates the four outputs of FusedRec>FusedSender (the message's length is the unique
// count, known only after the dedup), or returns InvalidArgument naming the pair when a key cannot be packed.
// With hot_keys (FusedRec>FusedSenderHot: sorted unified keys of a replicated hot set), the pairs among them are not
// sent and a fifth output holds their positions in hot_keys. Inputs and segment ranges are validated by the caller.
template <typename Device, typename K>
struct FusedSenderFunctor {
  Status operator()(OpKernelContext* ctx, const Tensor& keys, const Tensor& segment_ids, int64_t num_ranks,
                    int64_t num_segments, SenderWire wire, const Tensor* hot_keys = nullptr);
};

}  // namespace fusedrec
}  // namespace tensorflow

#endif  // CC_KERNELS_FUSED_SENDER_OP_H_

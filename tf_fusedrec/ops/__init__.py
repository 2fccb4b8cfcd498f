"""The FusedRec TensorFlow ops (CPU kernels in cc/), with NumPy references in tf_fusedrec.ops.reference."""

from tf_fusedrec.ops._loader import library_path, load_ops
from tf_fusedrec.ops.category_unique_ops import (
    CategoryUniqueResult,
    category_unique,
    decode_unified_keys,
    packed_key_bits,
    packed_segment_bits,
)
from tf_fusedrec.ops.partition_ops import PartitionResult, owner_of, partition_by_owner
from tf_fusedrec.ops.segment_unique_ops import SegmentUniqueResult, segment_unique

__all__ = [
    "CategoryUniqueResult",
    "PartitionResult",
    "SegmentUniqueResult",
    "category_unique",
    "decode_unified_keys",
    "library_path",
    "load_ops",
    "owner_of",
    "packed_key_bits",
    "packed_segment_bits",
    "partition_by_owner",
    "segment_unique",
]

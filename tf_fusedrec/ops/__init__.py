"""The FusedRec TensorFlow ops (CPU kernels in cc/), with NumPy references in tf_fusedrec.ops.reference."""

from tf_fusedrec.ops._loader import library_path, load_ops
from tf_fusedrec.ops.category_unique_ops import (
    CategoryUniqueResult,
    category_unique,
    decode_unified_keys,
    packed_key_bits,
    packed_segment_bits,
)
from tf_fusedrec.ops.dot_interaction_ops import dot_interaction
from tf_fusedrec.ops.fuse_ids_ops import fuse_ids
from tf_fusedrec.ops.fused_sender_ops import FusedSenderHotResult, FusedSenderResult, fused_sender, fused_sender_hot
from tf_fusedrec.ops.gather_segment_sum_ops import gather_segment_sum
from tf_fusedrec.ops.hashed_rows_ops import hashed_rows
from tf_fusedrec.ops.native_table_ops import (
    NativeTableAccessStatus,
    NativeTableConfig,
    NativeTableExportResult,
    NativeTableFindResult,
    NativeTableResource,
    adam_bias_corrected_lr,
    create_native_table,
    native_table_access_status,
    native_table_apply_sparse,
    native_table_changes,
    native_table_clear_changes,
    native_table_export,
    native_table_export_chunk,
    native_table_find,
    native_table_lookup_or_init,
    native_table_remove,
    native_table_set_access_status,
    native_table_size,
    native_table_upsert,
)
from tf_fusedrec.ops.partition_ops import PartitionResult, owner_of, partition_by_owner
from tf_fusedrec.ops.ragged_attention_ops import ragged_causal_attention
from tf_fusedrec.ops.row_ids_ops import row_ids
from tf_fusedrec.ops.segment_unique_ops import SegmentUniqueResult, segment_unique
from tf_fusedrec.ops.upper_triangle_ops import upper_triangle
from tf_fusedrec.ops.valid_ids_ops import id_extremes, valid_ids

__all__ = [
    "CategoryUniqueResult",
    "FusedSenderHotResult",
    "FusedSenderResult",
    "NativeTableAccessStatus",
    "NativeTableConfig",
    "NativeTableExportResult",
    "NativeTableFindResult",
    "NativeTableResource",
    "PartitionResult",
    "adam_bias_corrected_lr",
    "SegmentUniqueResult",
    "category_unique",
    "create_native_table",
    "decode_unified_keys",
    "dot_interaction",
    "fuse_ids",
    "fused_sender",
    "fused_sender_hot",
    "gather_segment_sum",
    "hashed_rows",
    "id_extremes",
    "library_path",
    "load_ops",
    "native_table_access_status",
    "native_table_apply_sparse",
    "native_table_changes",
    "native_table_clear_changes",
    "native_table_export",
    "native_table_export_chunk",
    "native_table_find",
    "native_table_lookup_or_init",
    "native_table_remove",
    "native_table_set_access_status",
    "native_table_size",
    "native_table_upsert",
    "owner_of",
    "packed_key_bits",
    "packed_segment_bits",
    "partition_by_owner",
    "ragged_causal_attention",
    "row_ids",
    "segment_unique",
    "upper_triangle",
    "valid_ids",
]

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's BFC allocator for host tensors unless the user chose: TensorFlow 2.21's default CPU allocator gave a
# step's large outputs freshly mapped pages (about 50k page faults a second on criteo_synthetic's 2-worker `fused`
# step, none on 2.16), 10-15% of the step; issue 54's journal entry of 2026-11-29 has the measurements.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# TFRA imports pkg_resources and warns on every layer about savers this app does not use; keep the output readable.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

from tf_fusedrec.bench.train_bench import main  # noqa: E402
from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402

main()
# The report is written: leave without the interpreter's teardown. Destroying the modes' pipelines (each a model, its
# tables and a prefetching tf.data iterator) took 12-20 s after the last line on loopback, most of it waiting in
# tf.data's iterator destructors (measured: the 2-worker run of tests/apps/test_bench.py ended 56-63 s after it
# started, 37 s with this exit).
comm_lib.exit_after_success("bench_done")

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's BFC allocator for host tensors unless the user chose: TensorFlow 2.21's default CPU allocator gave a
# step's large outputs freshly mapped pages (about 50k page faults a second on criteo_synthetic's 2-worker `fused`
# step, none on 2.16), 10-15% of the step; issue 54's journal entry of 2026-11-29 has the measurements.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# TFRA imports pkg_resources and warns on every layer about savers this app does not use; keep the output readable.
warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import tf_fusedrec  # noqa: E402,F401  (tf_fusedrec.train, run first by `python -m`, imported TensorFlow quietly)
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

from tf_fusedrec.distributed import comm as comm_lib  # noqa: E402
from tf_fusedrec.train.app import main  # noqa: E402

main()
# The run ended normally: the short summary is shown, the summary JSON, the checkpoints and the TensorBoard events
# (closed by the app) are written. Leave without the interpreter's teardown (0.8 s of CPU per process on the tests'
# tiny config).
comm_lib.exit_after_success("train_done")

"""fused_sender against fused_sender_hot on one core: a criteo_synthetic-like group (26 x 2048 zipf keys, 13
categories, 2 ranks), 200 calls each in a tf.function, hot sets of R random unique pairs. Run from a tree's root:
    taskset -c 1 .venv/bin/python benchmarks/results/perf/fused_sender_hot_micro/time_sender.py
(PYTHONPATH=TREE to time another tree's op library)."""
import os, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf
import tf_fusedrec.ops as fro
from tf_fusedrec.ops import reference as ref
tf.config.threading.set_intra_op_parallelism_threads(1); tf.config.threading.set_inter_op_parallelism_threads(1)
rng = np.random.default_rng(0)
n, S = 26 * 2048, 13
keys = (rng.zipf(1.2, n) % (1 << 20)).astype(np.int64); segs = rng.integers(0, S, n).astype(np.int32)
u = ref.category_unique(keys, segs, S, "packed").unified_keys
print("unique", u.size)
k, s = tf.constant(keys), tf.constant(segs)
def timeit(fn, reps=200):
    fn(); t = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - t) / reps * 1e3
plain = tf.function(lambda: fro.fused_sender(k, s, 2, S, "packed").message)
print("plain", round(timeit(plain), 3), "ms")
for R in (0, 2000, 20000):
    hot = tf.constant(np.sort(rng.permutation(u)[:R]).astype(np.int64))
    f = tf.function(lambda: fro.fused_sender_hot(k, s, hot, 2, S, "packed").message)
    print("hot", R, round(timeit(f), 3), "ms")

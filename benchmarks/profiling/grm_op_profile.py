"""Where a GRM training step's time goes, by TensorFlow op type (issue 23 item 3's profile): one worker, in process.

    .venv/bin/python benchmarks/profiling/grm_op_profile.py --median 32 --out benchmarks/results/grm/profile/median32.json

configs/grm_synthetic.yaml's model and features on native tables, its data with --median as the median history
length, histories capped at 200 (truncated to their last 200 items, movielens1m_seq.yaml's cap), batches of --batch.
A plain training step (sigmoid cross-entropy over the two tasks, the grouped optimizer) as one tf.function: --warmup
steps, then --steps timed steps (tokens/s, samples/s), then --steps steps under tf.profiler, summed per op type as
benchmarks/profiling/op_profile.py does (nested events count in their own type and in their caller's: the function call's own
type, "Process" here, holds the whole step).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from op_profile import op_times  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--median", type=int, default=32, help="median history length (grm_synthetic's median_length)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import tensorflow as tf  # noqa: PLC0415
    import yaml  # noqa: PLC0415

    import tf_fusedrec as fr  # noqa: PLC0415
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "configs/grm_synthetic.yaml").read_text())
    raw["data"]["sequences"].update(median_length=args.median, longest_length=max(200, args.median),
                                    max_length=200, truncate=True)
    config = cfg.parse_config(raw, where="grm_op_profile")
    embedding = experiment.make_embedding("fused", config.embedding_features(), config, table_backend="native")
    model = experiment.make_model(config, embedding)
    optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
    batches = iter(experiment.make_dataset(config, args.batch, 0, 1))

    @tf.function(reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, model(features, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    warm = [next(batches) for _ in range(args.warmup)]
    timed = [next(batches) for _ in range(args.steps)]
    for b in warm:
        step(*b)
    began = time.perf_counter()
    for b in timed:
        step(*b)
    step_s = (time.perf_counter() - began) / args.steps
    tokens = sum(int(b[0]["items"].values.shape[0]) for b in timed) / args.steps
    pairs = sum(int(tf.reduce_sum(n * (n + 1) // 2)) for n in (b[0]["items"].row_lengths() for b in timed)) / args.steps
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    for b in timed:
        step(*b)
    tf.profiler.experimental.stop()
    ops = op_times(logdir, args.steps)
    result = {"command": "python benchmarks/profiling/grm_op_profile.py " + " ".join(sys.argv[1:]), "median_length": args.median,
              "batch": args.batch, "step_ms": step_s * 1e3, "tokens_per_step": tokens, "pairs_per_step": pairs,
              "tokens_per_s": tokens / step_s, "samples_per_s": args.batch / step_s,
              "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]["ms_per_step"]))}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"median {args.median}: step {step_s * 1e3:.1f} ms, {tokens:.0f} tokens and {pairs:.0f} (i, j <= i) pairs "
          f"a step, {tokens / step_s:,.0f} tokens/s, {args.batch / step_s:.0f} samples/s")
    for name, v in list(result["ops"].items())[:15]:
        print(f"  {name:40s} {v['ms_per_step']:8.2f} ms/step  x{v['count_per_step']:.0f}")


if __name__ == "__main__":
    main()

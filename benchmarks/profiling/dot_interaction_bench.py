"""Times ops.dot_interaction's forward and gradient kernels alone, for an A/B of two op libraries in one run.

    .venv/bin/python benchmarks/profiling/dot_interaction_bench.py [--libs A.so,B.so] [--rounds 3] [--batch 2048] [--features 27]
        [--dim 16] [--threads 1] [--out OUT.json]

Each library runs in a subprocess of its own (TF_FUSEDREC_OPS_LIB=lib; "default": the library of this tree), the
libraries alternating round by round, so drift in the machine's load reaches both alike. A subprocess times blocks of
100 calls of FusedRec>DotInteraction and FusedRec>DotInteractionGrad on fixed random inputs (DLRM's shapes by default:
the bottom MLP and 26 features, dim 16, a worker's batch of 2048) with --threads intra-op threads, and reports the
fastest and the median of 5 blocks in ms per call, and a sha256 of each output (equal digests: bit-equal results).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measure(args):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import time  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from tf_fusedrec.ops._loader import load_ops  # noqa: PLC0415

    lib = load_ops()
    rng = np.random.default_rng(args.seed)
    pairs = args.features * (args.features - 1) // 2
    x = tf.constant(rng.normal(size=(args.batch, args.features, args.dim)).astype(np.float32))
    g = tf.constant(rng.normal(size=(args.batch, pairs)).astype(np.float32))
    calls = {"forward": tf.function(lambda: lib.fused_rec_dot_interaction(x)),
             "gradient": tf.function(lambda: lib.fused_rec_dot_interaction_grad(g, x))}
    # With --feature-major, the same x transposed to [F, B, D]: the values are bit for bit the same (equal sha256 of
    # the gradient transposed back).
    if args.feature_major:
        xf = tf.constant(np.ascontiguousarray(x.numpy().transpose(1, 0, 2)))
        calls["forward_feature_major"] = tf.function(lambda: lib.fused_rec_dot_interaction(xf, feature_major=True))
        calls["gradient_feature_major"] = tf.function(
            lambda: lib.fused_rec_dot_interaction_grad(g, xf, feature_major=True))
    result = {}
    for name, call in calls.items():
        value = call().numpy()
        if name == "gradient_feature_major":
            value = np.ascontiguousarray(value.transpose(1, 0, 2))
        digest = hashlib.sha256(value.tobytes()).hexdigest()
        for _ in range(20):
            call()
        blocks = []
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(100):
                call()
            blocks.append((time.perf_counter() - began) / 100 * 1e3)
        blocks.sort()
        result[name] = {"ms_min": round(blocks[0], 4), "ms_median": round(blocks[2], 4), "sha256": digest}
    print(json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--libs", default="default", help="comma-separated op libraries (default: this tree's)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--features", type=int, default=27)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0: TensorFlow's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--feature-major", action="store_true",
                   help="also time the ops on x stacked feature-major ([F, B, D]): libraries with the feature_major "
                        "attribute only")
    p.add_argument("--out", help="also write the results to this JSON file")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the subprocess
    args = p.parse_args()
    if args.measure:
        return measure(args)
    libs = args.libs.split(",")
    flags = ["--batch", str(args.batch), "--features", str(args.features), "--dim", str(args.dim), "--threads",
             str(args.threads), "--seed", str(args.seed), "--measure"] + (["--feature-major"] if args.feature_major else [])
    report = {"command": "python benchmarks/profiling/dot_interaction_bench.py " + " ".join(sys.argv[1:]),
              "load_average_start": list(os.getloadavg()), "runs": []}
    for round_ in range(args.rounds):
        for lib in libs:
            env = dict(os.environ)
            if lib != "default":
                env["TF_FUSEDREC_OPS_LIB"] = os.path.abspath(lib)
            done = subprocess.run([sys.executable, __file__, *flags], env=env, capture_output=True, text=True,
                                  timeout=600, check=False)
            if done.returncode != 0:
                sys.exit(f"{lib}: exited {done.returncode}:\n{done.stderr[-3000:]}")
            run = {"round": round_, "lib": lib, **json.loads(done.stdout.strip().splitlines()[-1])}
            report["runs"].append(run)
            print(f"round {round_} {lib}: " + ", ".join(f"{k} {v['ms_min']:.3f}/{v['ms_median']:.3f} ms"
                                                        for k, v in run.items() if isinstance(v, dict)), flush=True)
    report["load_average_end"] = list(os.getloadavg())
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

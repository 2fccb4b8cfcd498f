"""The sender side of a group lookup: the fused op (FusedSender) against the op chain it replaces (ChainSender).

    python -m tf_fusedrec.bench.sender [--features 26] [--batch 2048] [--ranks 2] [--wire packed] [--rounds 7]

One group of `features` features, `batch` Zipf ids each (criteo_synthetic's vocab and exponent), fused as
group_lookup.fuse fuses them. Each sender's send_keys runs in its own tf.function over an all-to-all that hands the
buffer back (the wire's decode after it is the same op in both). Rounds alternate the two, so a noisy machine slows
both alike; each round prints the median time per call of each, of the fuse alone (the part both share, with the
function call's fixed cost) and the ratio chain/fused; the last line the median ratio.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

from tf_fusedrec.distributed import group_lookup as gl  # noqa: E402


class LoopbackComm:
    """`size` ranks' routing in one process: the all-to-all returns the send buffer."""

    def __init__(self, size):
        self.rank, self.size = 0, size

    def alltoall(self, tensor, splits, name):  # noqa: ARG002
        return tensor, splits


def make_ids(features, batch, vocab, zipf, seed):
    rng = np.random.default_rng(seed)
    return [tf.constant(np.minimum(rng.zipf(zipf, batch), vocab) - 1, tf.int64) for _ in range(features)]


def time_calls(fn, calls):
    """Median seconds per call over `calls` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=int, default=26)
    p.add_argument("--batch", type=int, default=2048, help="ids per feature")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--wire", choices=["packed", "pair"], default="packed")
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--zipf", type=float, default=1.225)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200, help="timed calls per sender and round")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)

    comm = LoopbackComm(args.ranks)
    wire = gl.PackedWire(args.features) if args.wire == "packed" else gl.PairWire()
    categories = list(range(args.features))
    ids = make_ids(args.features, args.batch, args.vocab, args.zipf, seed=0)
    senders = {
        "chain": gl.ChainSender(gl.segment_dedup, gl.AllToAllRoute(comm, wire), args.features),
        "fused": gl.FusedSender(comm, wire, args.features),
    }

    def step(sender):
        @tf.function(autograph=False)
        def run():
            keys, segments, _ = gl.fuse(ids, categories)
            return sender.send_keys(keys, segments, "bench/keys") if sender else (keys, segments)

        return run

    steps = {name: step(s) for name, s in senders.items()}
    outs = {name: [t.numpy() for t in f()] for name, f in steps.items()}
    steps["fuse"] = step(None)
    for a, b in zip(outs["chain"], outs["fused"]):
        np.testing.assert_array_equal(a, b)  # the same results, or the timing means nothing
    for f in steps.values():
        time_calls(f, args.calls // 4)  # warm-up

    n = args.features * args.batch
    print(f"sender: {args.features} features x {args.batch} ids = {n} keys, {outs['fused'][0].shape[0]} unique pairs, "
          f"{args.ranks} ranks, {args.wire} wire; median us per call")
    ratios = []
    for r in range(args.rounds):
        order = ("chain", "fused", "fuse") if r % 2 == 0 else ("fused", "chain", "fuse")
        t = {name: time_calls(steps[name], args.calls) for name in order}
        ratios.append(t["chain"] / t["fused"])
        print(f"round {r}: chain {t['chain'] * 1e6:8.1f}  fused {t['fused'] * 1e6:8.1f}  fuse alone "
              f"{t['fuse'] * 1e6:8.1f}  chain/fused {ratios[-1]:.2f}")
    print(f"median chain/fused: {np.median(ratios):.2f}")


if __name__ == "__main__":
    main()

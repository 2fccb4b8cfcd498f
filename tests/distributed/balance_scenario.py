"""Token-balanced training (fr.train.balance): runs alone or under horovodrun, one model per run in one process.

    horovodrun -np 2 -H localhost:2 --gloo python tests/distributed/balance_scenario.py --out DIR \
        --runs sgd_samples,adagrad_tokens,local_sgd_samples,acc_sgd_samples_b2
    python tests/distributed/balance_scenario.py --union-of 2 --out DIR --runs sgd_samples,acc_sgd_samples,...

Data: rank r's stream of samples (a user id, a long-tailed ragged history of item ids with a label per item, a
sample label) is cut by a TokenBatcher, so the two ranks' batches hold different numbers of samples with similar
token counts. A worker trains on its own rank's batches; with --union-of U, one process trains on the union of
ranks 0..U-1's batches of each step, in rank order (what U workers see together).

Model: a FusedEmbedding (packed keys) with the history as a sequence feature (combiner=None, one row per item) and
as a mean-combined feature, and a user id; a dense head scores each item from its row and the user's, another
scores the sample. A sample's loss is its squared error plus its items' squared errors.

Runs (name -> table optimizer, dense optimizer, weighting):
  sgd_samples: sgd, sgd, by samples. adagrad_tokens: adagrad, adam, by tokens. One step per batch, the loss
    weighted by the global count (balance.GlobalMeanLoss): every worker's sum x N / G.
  local_*: the naive loss, each worker's own mean (sum / local count), what balancing must not be trained with.
  acc_*: balance.Accumulator: each source batch of a step is a micro-batch of its own step (K = sources x batches
    per step), applied once.
  *_b2: two consecutive batches per step (per update).

Writes DIR/rank{r}.npz with, per run X: X/table/{feature}/{id} (rows this worker holds), X/slot/{slot}/{feature}/{id},
X/{token,sample}_{kernel,bias}, X/initial_token_kernel, X/samples and X/tokens [steps, batches of the step] of
the batches trained (sources in rank order, then consecutive batches), and for runs without accumulation
X/worker_counts [steps, workers, 2]: every worker's [samples, tokens] per step as balance.worker_counts gathers them.
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_fusedrec.train import balance  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_scenario  # noqa: E402
import scenario as sc  # noqa: E402

SAMPLES_PER_RANK = 90
MAX_LENGTH = 12  # the longest history
TARGET_TOKENS = 24
NUM_ITEMS, NUM_USERS = 24, 16
IDS = np.arange(max(NUM_ITEMS, NUM_USERS), dtype=np.int64)
FEATURES = ("history", "history_mean", "user_id")
SIGNATURE = balance.batch_signature(sequences={"history": tf.int64, "item_labels": tf.float32},
                                    scalars={"user_id": tf.int64, "label": tf.float32})


@dataclasses.dataclass(frozen=True)
class Run:
    table_optimizer: str
    dense_optimizer: str
    by: str
    loss: str = "global"  # "global": GlobalMeanLoss; "local": each worker's own mean
    accumulate: bool = False
    batches_per_step: int = 1


def parse_run(name):
    """[acc_|local_](sgd_samples|adagrad_tokens)[_b2] -> Run."""
    accumulate, loss, base, per_step = False, "global", name, 1
    if base.startswith("acc_"):
        accumulate, base = True, base[len("acc_"):]
    elif base.startswith("local_"):
        loss, base = "local", base[len("local_"):]
    if base.endswith("_b2"):
        per_step, base = 2, base[:-len("_b2")]
    table, dense, by = {"sgd_samples": ("sgd", "sgd", "samples"), "adagrad_tokens": ("adagrad", "adam", "tokens")}[base]
    return Run(table, dense, by, loss, accumulate, per_step)


def rank_stream(rank):
    """Rank r's samples: long-tailed history lengths in [0, MAX_LENGTH] (some empty), Zipf-like item ids."""
    rng = np.random.default_rng([11, rank])
    lengths = np.minimum(np.floor(rng.pareto(1.0, SAMPLES_PER_RANK) * 2).astype(int) + 1, MAX_LENGTH)
    lengths[rng.random(SAMPLES_PER_RANK) < 0.08] = 0
    for n in lengths:
        yield {
            "user_id": int(rng.integers(0, NUM_USERS)),
            "history": (np.minimum(rng.zipf(1.6, n), NUM_ITEMS) - 1).tolist(),
            "item_labels": rng.normal(size=n).astype(np.float32).tolist(),
            "label": float(rng.normal()),
        }


def rank_batches(rank, needed):
    batcher = balance.TokenBatcher(TARGET_TOKENS, buffer_size=8, tokens_of="history", max_sequence_tokens=MAX_LENGTH)
    batches = list(batcher(rank_stream(rank)))
    if len(batches) < needed:
        raise RuntimeError(f"rank {rank}'s stream gives {len(batches)} batches, the runs need {needed}")
    return batches[:needed]


class SequenceModel(tf.keras.Model):
    """-> (item scores float32 [tokens], sample scores float32 [B])."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.token_head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))
        self.sample_head = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=5))
        self.token_head.build([None, 8])  # built here so the Accumulator sees every variable before training
        self.sample_head.build([None, 7])

    def call(self, inputs, training=None):
        history = inputs["history"]
        out = self.embedding({"history": history, "history_mean": history, "user_id": inputs["user_id"]},
                             training=training)
        user = out["user_id"]
        items = out["history"]  # ragged [B, None, 4]
        token_x = tf.concat([items.flat_values, tf.gather(user, items.value_rowids())], axis=1)
        sample_x = tf.concat([user, out["history_mean"]], axis=1)
        return self.token_head(token_x)[:, 0], self.sample_head(sample_x)[:, 0]


def item_losses(model, batch):
    """Per-item losses of a batch: the items' squared errors, then the samples'."""
    token_scores, sample_scores = model(batch, training=True)
    return tf.concat([tf.square(token_scores - batch["item_labels"].flat_values),
                      tf.square(sample_scores - batch["label"])], axis=0)


def build(name, run):
    optimizer = {"name": run.table_optimizer, "learning_rate": 0.1}
    features = [fr.Feature("history", dim=4, optimizer=optimizer, max_id_bits=20),
                fr.Feature("history_mean", dim=3, combiner="mean", optimizer=optimizer, max_id_bits=20),
                fr.Feature("user_id", dim=4, optimizer=optimizer, max_id_bits=20)]
    layer = fr.FusedEmbedding(features, name=f"{name}_embedding")
    model = SequenceModel(layer)
    dense = {"name": run.dense_optimizer, "learning_rate": 0.1 if run.dense_optimizer == "sgd" else 0.01}
    return layer, model, fr.train.make_optimizer(model, default=dense)


def step_function(name, run, model, optimizer, comm):
    weighted = balance.GlobalMeanLoss(comm, by=run.by, name=f"FusedRec/{name}/count")
    weighting = balance.get_weighting(run.by)

    def step(batch):
        with tf.GradientTape() as tape:
            losses = item_losses(model, batch)
            lengths = batch["history"].row_lengths()
            if run.loss == "local":
                loss = tf.reduce_sum(losses) / tf.cast(weighting.local_count(lengths), tf.float32)
            else:
                loss = weighted(losses, lengths).loss
        variables = model.trainable_variables
        with tf.control_dependencies([optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))]):
            local = tf.stack([balance.get_weighting("samples").local_count(lengths),
                              balance.get_weighting("tokens").local_count(lengths)])
        # Every worker's [samples, tokens] of the step, for the summary metrics.
        return balance.worker_counts(local, comm, name=f"FusedRec/{name}/worker_counts")

    return tf.function(step, input_signature=[SIGNATURE], autograph=False)


def micro_step_function(run, model, accumulator):
    weighting = balance.get_weighting(run.by)

    def micro_step(batch):
        with tf.GradientTape() as tape:
            loss_sum = tf.reduce_sum(item_losses(model, batch))
        variables = model.trainable_variables
        return accumulator.accumulate(zip(tape.gradient(loss_sum, variables), variables),
                                      count=weighting.local_count(batch["history"].row_lengths()))

    return tf.function(micro_step, input_signature=[SIGNATURE], autograph=False)


def train(name, args, rank, sources):
    run = parse_run(name)
    per_source = {s: rank_batches(s, args.steps * run.batches_per_step) for s in sources}
    steps = []  # per step: the micro-batches (lists of samples), sources in rank order, then consecutive batches
    for step in range(args.steps):
        steps.append([per_source[s][step * run.batches_per_step + j]
                      for s in sources for j in range(run.batches_per_step)])
    layer, model, optimizer = build(name, run)
    initial_token_kernel = model.token_head.kernel.numpy()
    if run.accumulate:
        accumulator = balance.Accumulator(model, optimizer, name=f"{name}_accumulator")
        micro_step = micro_step_function(run, model, accumulator)
        apply = tf.function(accumulator.apply, autograph=False)
        micro_batches = iter(balance.to_dataset(lambda: (b for micro in steps for b in micro), SIGNATURE))
        for micro in steps:
            for _ in micro:
                micro_step(next(micro_batches))
            apply()
    else:
        step = step_function(name, run, model, optimizer, layer.comm)
        gathered = [step(batch).numpy() for batch in
                    balance.to_dataset(lambda: ([s for b in micro for s in b] for micro in steps), SIGNATURE)]
    result = {} if run.accumulate else {"worker_counts": np.stack(gathered)}
    result.update({
        "samples": np.array([[len(b) for b in micro] for micro in steps]),
        "tokens": np.array([[sum(len(s["history"]) for s in b) for b in micro] for micro in steps]),
        "initial_token_kernel": initial_token_kernel,
        "token_kernel": model.token_head.kernel.numpy(), "token_bias": model.token_head.bias.numpy(),
        "sample_kernel": model.sample_head.kernel.numpy(), "sample_bias": model.sample_head.bias.numpy(),
    })
    for feature in FEATURES:
        for i, row in zip(IDS, sc.table_rows(layer, feature, IDS)):
            if row is not None:
                result[f"table/{feature}/{i}"] = row
        for slot, rows in pipeline_scenario.slot_rows(optimizer, layer, feature, IDS).items():
            for i, row in zip(IDS, rows):
                if row is not None:
                    result[f"slot/{slot}/{feature}/{i}"] = row
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default="sgd_samples,adagrad_tokens")
    p.add_argument("--steps", type=int, default=4, help="updates per run")
    p.add_argument("--union-of", type=int, default=1,
                   help="one process trains on the union of ranks 0..U-1's batches (U workers' data)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank, size = sc.init_workers()
    if size > 1 and args.union_of != 1:
        raise SystemExit("--union-of is for one process")
    sources = list(range(args.union_of)) if size == 1 else [rank]
    saved = {}
    for name in args.runs.split(","):
        for key, value in train(name, args, rank, sources).items():
            saved[f"{name}/{key}"] = value
    sc.save_rank(args.out, rank, saved)


if __name__ == "__main__":
    main()
    sc.exit_now()  # (see there: the teardown costs seconds per process)

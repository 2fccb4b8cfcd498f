"""The trainer's side of publishing to serving (`python -m tf_fusedrec.train --publish-to RANKER --publish-every N`).

Every N steps the workers publish the model as a new version (the protocol: tf_fusedrec/serve/publish.py):

  1. rank 0 picks the version (one above the newest any embedding server holds) and every rank learns it;
  2. every rank stages, on the servers owning their routing ranges, the rows of its shard that changed since the last
     version the rankers took (new keys included) and the keys it no longer holds; rank 0 also stages the replicated
     hot rows that changed (every rank leaves hot keys out of its shard's rows: the hot copy is the model's);
  3. the ranks agree that all of them staged; rank 0 commits the version on every server, then sends the dense
     weights to every ranker, which makes the version current;
  4. the ranks agree on the outcome: after a success each remembers its rows as the base of the next delta; after a
     failure (a server or ranker down, an answer refused) the next publish carries everything since the last version
     that reached the rankers, and removes the keys the failed ones staged that are gone since (a server may have
     committed them), and training goes on (rank 0 logs the failure; the summary counts it).

A process's first version is full: it replaces whatever the servers held (an export of another run, or of an older
step), so a trainer never has to know what was loaded.

Finding what changed since the last version the rankers took:
* native tables (the default backend) track it themselves (NativeEmbeddingTable.changes): the rows a lookup inserted
  or an update or upsert wrote since the last success, and the keys removed since then. A publish reads those rows
  only, not the whole shard; after a success each rank clears its tables' changes, after a failure it leaves them,
  so the next publish carries everything since the last success (and removes what was removed since, including the
  keys a failed attempt staged). A row written without changing (a zero gradient) is staged too.
* TFRA tables (and the replicated hot rows) are exported whole and compared bit for bit with a host copy of the last
  version's rows (row_changes).
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec.export import writer
from tf_fusedrec.layers.fused_embedding import FusedEmbedding
from tf_fusedrec.serve import publish
from tf_fusedrec.train import checkpoint
from tf_fusedrec.train.optimizer import embedding_layers


def row_changes(previous, keys, rows):
    """(bool [K] over keys: new or changed bit for bit since `previous`, int64 keys of previous no longer held): a
    delta checkpoint's change detection (checkpoint.changes) over rows without slots.

    Args:
      previous: (keys int64 [P], rows float32 [P, dim]) or None (everything is new). Fastest with its keys sorted
        (sorted_rows gives that; publish() keeps each version's rows so): then it is not sorted again.
      keys / rows: the current ones, any order (sorted: the lookups run in order, the fastest too).
    """
    if previous is None:
        return np.ones(len(keys), bool), np.zeros(0, np.int64)
    old_keys, old_rows = previous
    if len(old_keys) > 1 and not (old_keys[1:] > old_keys[:-1]).all():
        old_keys, old_rows = sorted_rows(old_keys, old_rows)
    return checkpoint.changes(checkpoint.TableState(old_keys, old_rows, ()), checkpoint.TableState(keys, rows, ()))


def tracked_tables(layer):
    """The layer's sharded tables when every one tracks its changes (native tables of a FusedEmbedding), else None
    (the publisher then exports and compares)."""
    if isinstance(layer, FusedEmbedding) and all(hasattr(t, "changes") for t in layer.tables):
        return list(layer.tables)
    return None


def sorted_rows(keys, rows):
    """(keys, rows) in the order of the keys (np.take: a third of the time of rows[order] here)."""
    order = np.argsort(keys, kind="stable")
    return np.take(keys, order), np.take(rows, order, axis=0)


class TrainingPublisher:
    """Publishes a training model's versions to rankers and their embedding servers (module docstring).

    Args:
      model: the Keras model holding one FusedEmbedding (fusion "deferred") or PerFeatureEmbedding.
      comm: the workers' comm.
      rankers: ["host:port"] of the rankers' publish endpoints (--publish-port); they must read the same servers.
      timeout_s: deadline of each call to a server or ranker.
      log_dir: a directory every worker can write (a shared file system on several hosts), or None: each version
        that reaches the rankers is also written there (publish.write_log_*), so that an embedding server or a
        ranker started later catches up (--catch-up DIR) from the newest full version and the deltas after it.
      tls: a serve.security.TLS with a CA (--tls-ca; --tls-cert/--tls-key under mutual TLS): HTTPS to the rankers and
        TLS to the servers, or None.
      token: the publish token (bytes, --publish-token-file) sent with every publish call, or None.
    """

    def __init__(self, model, comm, rankers, timeout_s=60.0, log_dir=None, tls=None, token=None):
        layers = embedding_layers(model)
        if len(layers) != 1:
            raise ValueError(f"--publish-to: the model must hold exactly one embedding layer, found {len(layers)}")
        self.layer, self.comm, self.rankers = layers[0], comm, list(rankers)
        if not self.rankers:
            raise ValueError("--publish-to: give at least one ranker's publish address (host:port)")
        self.dense = writer.dense_variables(model, self.layer)
        self.tracked = tracked_tables(self.layer)  # None: export and compare
        self.log_dir = log_dir
        self.tls, self.token = tls, token
        targets = [publish.ranker_targets(a, timeout_s, tls=tls, token=token) for a in self.rankers]
        tables = [publish.table_of_targets(t) for t in targets]
        for address, table in zip(self.rankers[1:], tables[1:]):
            if table != tables[0]:
                raise ValueError(f"--publish-to: ranker {address} reads other embedding servers ({table!r}) than "
                                 f"ranker {self.rankers[0]} ({tables[0]!r})")
        expected = [(d["shape"], d["dtype"]) for d in targets[0]["dense"]]
        have = [(list(v.shape), tf.as_dtype(v.dtype).name) for v in self.dense]  # Keras 3: a tuple, a str
        if expected != have:
            raise ValueError(f"--publish-to: the ranker's model has dense weights {expected}, this model {have}: "
                             f"the ranker serves another model (export this config's model for it)")
        # Group names and dims as the export writes them (writer.group_parts), checked against the servers'.
        self.publisher = publish.Publisher(tables[0], timeout_s=timeout_s, tls=tls, token=token)
        served = {g.name: g.dim for g in self.publisher.info(tables[0].addresses[0]).groups}
        mine = {g["name"]: g["dim"] for g, *_ in writer.group_parts(self.layer)}
        if served != mine:
            raise ValueError(f"--publish-to: the embedding servers hold groups {served}, this model's are {mine}")
        self.served_version = min(int(t["version"]) for t in targets)  # what the rankers read: kept on the servers
        # {group: ((keys, rows) or None where the table tracks its changes, (hot keys, hot rows))} of the last version
        # the rankers took
        self.previous = None
        # {group: int64 keys} this rank staged in publishes since then that failed: committed on some servers
        # perhaps, so the next delta removes those this rank no longer holds (the others it stages anyway: they
        # changed since the last version the rankers took). Empty where the tables track their changes: they keep
        # reporting those keys, and their removal, until a publish succeeds.
        self.uncertain = {}
        self.versions, self.failures, self.bytes, self.rows, self.seconds = [], 0, [], [], []
        self.rows_held = []  # rank 0: the rows of each version on the servers (the model's rows at its step)
        self.stream_positions = []  # per version: where the training data stood at its step (a list), or None
        self.last_error = None

    def _parts(self, tracked):
        """[(group {"name", "dim"}, keys, rows, removed or None, hot keys, hot rows)] of this rank: the whole shard
        (writer.group_parts) or, `tracked`, each table's changes since the last success."""
        if not tracked:
            return [(group, keys, rows, None, hot_keys, hot_rows)
                    for group, keys, rows, hot_keys, hot_rows in writer.group_parts(self.layer)]
        layer = self.layer
        hot_tables = layer.hot_tables or [None] * len(layer.tables)
        parts = []
        for group, table, hot_table in zip(layer.groups, self.tracked, hot_tables):
            keys, rows, removed = table.changes()
            hot_keys, hot_rows = writer.hot_rows_of(hot_table, group.spec.dim)
            parts.append(({"name": group.name, "dim": int(group.spec.dim)}, keys, rows, removed, hot_keys, hot_rows))
        return parts

    def _agree(self, values, name):
        """int64 [size, len(values)]: every rank's values, in rank order."""
        return self.comm.allgather(tf.constant([values], tf.int64), name=name).numpy()

    def publish(self, step, stream_position=None):
        """Publishes the model of training step `step` (every rank calls it) -> True when the rankers took it.

        `stream_position`: where the training data stood after step `step` (a file source's data.files.FilePosition:
        the version learnt from the records before it, so a followed stream's files it has read are known), kept
        beside the version in summary()["stream_positions"]; None where the data has no such position.
        """
        rank, start = self.comm.rank, time.perf_counter()
        version, publish_id = -1, 0
        if rank == 0:
            try:
                version = max(max(self.publisher.newest_versions().values()), self.served_version) + 1
            except publish.PublishError as e:
                self.last_error = str(e)
            # A version number a failed attempt used may come again: its id tells the servers to drop those rows.
            publish_id = int.from_bytes(os.urandom(8), "little") >> 1
        version, publish_id = (int(x) for x in self._agree([version, publish_id],
                                                           f"FusedRec/publish/{step}/version")[0])
        if version < 0:
            return self._failed(step, self.last_error if rank == 0 else None)
        full = self.previous is None
        current, attempted, logged, staged, rows_staged, error = {}, {}, {}, 0, 0, None
        tracked = self.tracked is not None and not full
        try:
            for group, keys, rows, removed, hot_keys, hot_rows in self._parts(tracked):
                name, dim = group["name"], group["dim"]
                if len(hot_keys):
                    cold = ~np.isin(keys, hot_keys)
                    keys, rows = keys[cold], rows[cold]
                # In key order: the diff against the last version (kept in key order too) then reads both in order.
                hot_keys, hot_rows = sorted_rows(hot_keys, hot_rows)
                before = None if full else self.previous[name]
                if tracked:  # the table's changes since the last success: every row read is staged, as it came
                    changed = slice(None)
                else:
                    keys, rows = sorted_rows(keys, rows)
                    changed, removed = row_changes(before and before[0], keys, rows)
                if rank == 0:
                    hot_changed, hot_removed = row_changes(before and before[1], hot_keys, hot_rows)
                    # A key leaving the hot set is removed from the hot rows; its owner stages it as a new row.
                    keys_out = np.concatenate([keys[changed], hot_keys[hot_changed]])
                    rows_out = np.concatenate([rows[changed], hot_rows[hot_changed]])
                    removed = np.concatenate([removed, hot_removed[~np.isin(hot_removed, keys)]])
                else:
                    keys_out, rows_out = keys[changed], rows[changed]
                maybe = self.uncertain.get(name)
                if maybe is not None and not full:
                    # Keys a failed publish may have left on some servers, which this rank no longer holds.
                    removed = np.concatenate([removed, maybe[~np.isin(maybe, keys)]])
                # A key that moved into the hot set leaves this shard: not removed, rank 0 stages its hot row.
                removed = removed[~np.isin(removed, hot_keys)]
                attempted[name] = keys_out
                logged[name] = (keys_out, rows_out, removed)
                staged += self.publisher.stage(version, name, dim, keys_out, rows_out, removed, publish_id)
                rows_staged += len(keys_out)
                current[name] = (None if self.tracked is not None else (keys, rows), (hot_keys, hot_rows))
            if self.log_dir is not None:
                publish.write_log_rank(self.log_dir, version, rank, self.comm.size, logged)
        except publish.PublishError as e:
            error = str(e)
        except OSError as e:
            error = f"--publish-log {self.log_dir}: {e}"
        failed = self._agree([int(error is not None)], f"FusedRec/publish/{step}/staged")[:, 0]
        ok = 1
        if rank == 0:
            if failed.any():
                error = error or f"rank(s) {np.flatnonzero(failed).tolist()} could not stage version {version}"
                ok = 0
            else:
                try:
                    answers = self.publisher.commit(version, step, full, keep_from=self.served_version,
                                                    publish_id=publish_id)
                    primaries = {addresses[0] for _, _, addresses in self.publisher.table}
                    held = sum(a.versions[-1].rows for address, a in answers.items() if address in primaries)
                    weights = [v.numpy() for v in self.dense]
                    for address in self.rankers:
                        publish.push_dense(address, version, step, weights, tls=self.tls, token=self.token)
                except publish.PublishError as e:
                    error, ok = str(e), 0
        if rank == 0 and self.log_dir is not None:
            try:
                if ok:  # the version reached the rankers: it joins the log
                    publish.write_log_version(self.log_dir, version, step, full, self.comm.size, weights)
                else:
                    publish.drop_log_version(self.log_dir, version)
            except OSError as e:
                print(f"warning: --publish-log {self.log_dir}: version {version} is served but not logged: {e}",
                      file=sys.stderr, flush=True)
        ok = bool(self._agree([ok], f"FusedRec/publish/{step}/done")[0, 0])
        if not ok:
            # Perhaps committed on some servers: see self.uncertain (tracking tables need none: their changes stay).
            for name, keys in attempted.items() if self.tracked is None else ():
                self.uncertain[name] = np.union1d(self.uncertain.get(name, np.zeros(0, np.int64)), keys)
            return self._failed(step, error)
        self.previous, self.served_version, self.uncertain = current, version, {}
        for table in self.tracked or ():  # the base of the next delta (no step ran since the rows were read)
            table.clear_changes()
        if rank == 0:
            self.rows_held.append(held)
        agreed = self._agree([staged, rows_staged], f"FusedRec/publish/{step}/bytes").sum(0)
        sent, rows_sent = int(agreed[0]), int(agreed[1])
        self.versions.append((version, step, full))
        self.stream_positions.append(None if stream_position is None else [int(x) for x in stream_position])
        self.bytes.append(sent)
        self.rows.append(rows_sent)
        self.seconds.append(time.perf_counter() - start)
        if rank == 0:
            print(f"published version {version} (step {step}, {'full' if full else 'delta'}, {rows_sent} rows, "
                  f"{sent} bytes staged, {self.seconds[-1]:.2f} s)", file=sys.stderr, flush=True)
        return True

    def _failed(self, step, error):
        self.failures += 1
        if self.comm.rank == 0:
            print(f"warning: publishing step {step} failed; the rankers stay at version {self.served_version}: "
                  f"{error}", file=sys.stderr, flush=True)
        return False

    def summary(self):
        """{"versions": [[version, step, full]], "stream_positions" (each version's, or None), "failures",
        "rows_per_publish", "rows_held_per_publish", "bytes_per_publish", "seconds" (each publish's), "mean_seconds",
        ...}."""
        return {"rankers": self.rankers, "versions": [list(v) for v in self.versions],
                "stream_positions": self.stream_positions, "failures": self.failures,
                "rows_per_publish": self.rows, "rows_held_per_publish": self.rows_held,
                "bytes_per_publish": self.bytes,
                "seconds": [round(x, 4) for x in self.seconds],
                "mean_seconds": float(np.mean(self.seconds)) if self.seconds else None,
                "served_version": self.served_version}

    def close(self):
        self.publisher.close()

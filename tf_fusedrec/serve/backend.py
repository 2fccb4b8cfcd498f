"""Where a serving model's embedding rows come from: the interface, and the in-process backend.

A backend answers two questions per group of an export (fr.export format, tf_fusedrec/export/format.py):

  rows(group, ids, categories)  -> float32 [n, dim]
      the row of each (id, category) pair (pairs may repeat; ids never trained get the initializer's row);
  pooled(group, ids, categories, segments, num_segments) -> (float32 [S, dim] sums, int64 [S] counts)
      the rows summed per segment (a segment is one multi-hot bag: one feature of one instance) and how many ids each
      segment holds: what a combiner needs (sum; mean = sums / max(count, 1); sqrtn = sums / sqrt(max(count, 1))).

lookup_many([Lookup, ...]) answers several at once (a Lookup without segments is a rows() call, with them a pooled()
call), in the order asked: a serving model asks every group's rows and pools of a batch in one call, which a remote
backend sends as one request per server (RemoteBackend), so a batch costs one round trip. rows_many([(group, ids,
categories), ...]) is lookup_many of rows only.

A backend whose rows come in versions (RemoteBackend: embedding servers a trainer publishes to; a CachedBackend over
one) has `versioned = True`, and both calls take `version=`: the committed version to read (None: the newest), so that
a ranker reads every row of a batch from the version its dense weights are at (tf_fusedrec/serve/publish.py).

Backends: LocalBackend (every row in this process: fr.export.load_model), serve.client.RemoteBackend (embedding
servers over gRPC, with range routing, pooling on the servers and credits), serve.cache.CachedBackend (a ranker's
adaptive cache in front of another backend). Each reports its counters in stats().
"""

import collections

import numpy as np

from tf_fusedrec.export import format as fmt

Lookup = collections.namedtuple("Lookup", ["group", "ids", "categories", "segments", "num_segments"],
                                defaults=(None, None))
Lookup.__doc__ = """One question of lookup_many: the rows of (ids, categories) of a group, or with segments (int [n])
and num_segments their sums and counts per segment (pooled())."""


def pool(rows, segments, num_segments):
    """(sums float32 [S, dim], counts int64 [S]) of rows [n, dim] by segment [n]: np.add.at in the order of the ids,
    as training's unsorted_segment_sum adds them."""
    segments = np.asarray(segments, np.int64)
    sums = np.zeros((num_segments, rows.shape[1]), np.float32)
    np.add.at(sums, segments, rows)
    return sums, np.bincount(segments, minlength=num_segments).astype(np.int64)


class Backend:
    """The interface (see the module docstring)."""

    versioned = False

    def rows(self, group, ids, categories, version=None):
        raise NotImplementedError

    def rows_many(self, lookups, version=None):
        """[rows(group, ids, categories) for each (group, ids, categories) of lookups], through lookup_many."""
        return self.lookup_many([Lookup(group, ids, categories) for group, ids, categories in lookups], version)

    def lookup_many(self, lookups, version=None):
        """[rows() or (sums, counts) of pooled() for each Lookup], in order; a backend that can answer them together
        (RemoteBackend: one request per server) overrides it."""
        at = {} if version is None else {"version": version}
        return [self.rows(q.group, q.ids, q.categories, **at) if q.segments is None else
                self.pooled(q.group, q.ids, q.categories, q.segments, q.num_segments, **at) for q in lookups]

    def pooled(self, group, ids, categories, segments, num_segments, version=None):
        if version is None:
            return pool(self.rows(group, ids, categories), segments, num_segments)
        return pool(self.rows(group, ids, categories, version=version), segments, num_segments)

    def stats(self):
        return {}

    def close(self):
        pass


class LocalBackend(Backend):
    """Every group's rows of an export, in this process.

    Args:
      export_dir: the export.
      manifest: its manifest (read when None).
    """

    def __init__(self, export_dir, manifest=None):
        self.manifest = manifest or fmt.read_manifest(export_dir)
        self.groups = {g["name"]: fmt.GroupRows(export_dir, self.manifest, g) for g in self.manifest["groups"]}
        self._missing = 0
        self._looked_up = 0

    def _group(self, group):
        if group not in self.groups:
            raise fmt.ExportError(f"the export has no group {group!r} (groups: {sorted(self.groups)})")
        return self.groups[group]

    def rows(self, group, ids, categories, version=None):
        if version is not None:
            raise ValueError(f"LocalBackend holds one version of the rows (its export's), asked for version {version}")
        rows, missing = self._group(group).lookup(ids, categories)
        self._missing += missing
        self._looked_up += len(rows)
        return rows

    def stats(self):
        return {"rows_looked_up": self._looked_up, "rows_not_trained": self._missing,
                "table_bytes": sum(g.nbytes for g in self.groups.values())}

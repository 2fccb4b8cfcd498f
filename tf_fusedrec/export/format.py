"""The export format, read without TensorFlow: manifest, table shards, table keys, routing and initial rows.

An export directory (written by fr.export.export_model) holds:

    EXPORT/manifest.json                          what is below, with a sha256 and a size for every file
    EXPORT/dense/                                 a TensorFlow SavedModel of the dense part (signature
                                                  "serving_default": dense inputs + one embedding input per feature
                                                  -> {"scores": float32 [B]}; "serving_packed", the same function
                                                  with the float32 [B, d] inputs side by side in one input "packed",
                                                  columns as the manifest's dense "packed" "members" list them)
    EXPORT/tables/{group}/part-{i}-of-{P}.npz     keys int64 [K] (sorted), rows float32 [K, dim]

A group's rows are keyed by its table key (the training table's unified key): for a feature of category c (its
position in the group's sorted "features": the features that own rows; a feature that shares another's rows, manifest
feature "shares", reads that feature's category: its entry's "group" and "category" say so) and an id x,
  - packed encoding:  key = (c << (63 - b)) | x, b = max(1, ceil(log2(num_categories)))
  - hashed encoding:  key = mix64(uint64(x) XOR mix64(c + 0x9E3779B97F4A7C15))
  - identity (a per-feature table): key = x
(mix64 = the splitmix64 finalizer, as the training op category_unique forms them.)

Routing: route(key) = mix64(uint64(key)), a uint64. The hash space [0, 2**64) is cut into ranges; part i of P holds
the keys whose route lies in [i * 2**64 / P, (i + 1) * 2**64 / P). A server holds any range (start, end) and reads the
parts that overlap it, so any number of servers can serve any export, whatever the number of training workers.

Ids a table does not hold (never trained) get the initializer's row: Hashed rows are computed from (seed, feature, id)
exactly as in training; Zeros/Constant rows are constant; random initializers cannot be reproduced outside the
training process, so they give zeros (the manifest's initializer says which).
"""

import hashlib
import json
import os

import numpy as np

from tf_fusedrec import hashing

FORMAT = "tf_fusedrec.export/1"
ENCODINGS = ("packed", "hashed", "identity")
HASH_SPACE = 1 << 64
_GOLDEN = np.uint64(hashing.GOLDEN)


class ExportError(ValueError):
    """A missing, corrupt or inconsistent export; the message names the file or field."""


# --- keys and routing ------------------------------------------------------------------------------------------------


def table_keys(ids, categories, num_categories, encoding):
    """The table key of each (id, category) pair.

    Args:
      ids: int64 [n], ids >= 0.
      categories: int [n], each in [0, num_categories).
      num_categories: the group's number of categories (len of its manifest "features").
      encoding: "packed", "hashed" or "identity".

    Returns:
      int64 [n].
    """
    ids = np.asarray(ids, np.int64)
    if encoding == "identity":
        return ids.copy()
    categories = np.asarray(categories, np.int64)
    if encoding == "packed":
        shift = 63 - hashing.packed_bits(num_categories)
        return (categories << np.int64(shift)) | ids
    if encoding != "hashed":
        raise ExportError(f"unknown table encoding {encoding!r} (one of {ENCODINGS})")
    with np.errstate(over="ignore"):
        salt = hashing.mix64(categories.astype(np.uint64) + _GOLDEN)
    return hashing.mix64(ids.view(np.uint64) ^ salt).view(np.int64)


def route(keys):
    """uint64 [n]: where each key lies in the routing hash space."""
    return hashing.mix64(np.asarray(keys, np.int64).view(np.uint64))


def even_ranges(n):
    """n ranges [(start, end)] of equal width covering [0, 2**64) with no overlap (Python ints; end exclusive)."""
    if n < 1:
        raise ValueError(f"the number of ranges must be >= 1, got {n}")
    bounds = [i * HASH_SPACE // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def in_range(routes, start, end):
    """bool [n]: routes (uint64) in [start, end)."""
    routes = np.asarray(routes, np.uint64)
    below_end = np.ones(routes.shape, bool) if end >= HASH_SPACE else routes < np.uint64(end)
    return (routes >= np.uint64(start)) & below_end


def check_ranges(ranges):
    """ValueError unless the ranges [(start, end)] cover [0, 2**64) exactly once (sorted by start)."""
    position = 0
    for start, end in sorted(ranges):
        if start != position:
            raise ValueError(f"ranges leave a gap or overlap at {position:#x} (next range starts at {start:#x})")
        if not start < end <= HASH_SPACE:
            raise ValueError(f"range ({start:#x}, {end:#x}) is empty or beyond 2**64")
        position = end
    if position != HASH_SPACE:
        raise ValueError(f"ranges end at {position:#x}, not at 2**64")


# --- initial rows ----------------------------------------------------------------------------------------------------


def initial_rows(initializer, salts, ids, categories, dim):
    """float32 [n, dim] rows of ids the table does not hold.

    Args:
      initializer: the manifest's initializer dict ({"class_name": ..., "config": {...}}).
      salts: int64 [num_categories], the Hashed salt of each category (manifest "salts").
      ids / categories: [n].
    """
    n = len(ids)
    name = initializer.get("class_name")
    config = initializer.get("config", {})
    if name == "Hashed":
        salt = np.asarray(salts, np.int64)[np.asarray(categories, np.int64)] if n else np.zeros(0, np.int64)
        return hashing.hashed_rows_numpy(ids, salt, dim, config["stddev"])
    if name == "Constant":
        return np.full((n, dim), config.get("value", 0.0), np.float32)
    return np.zeros((n, dim), np.float32)  # Zeros, and random initializers (documented above)


# --- files -----------------------------------------------------------------------------------------------------------


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_name(group, index, parts):
    return os.path.join("tables", group, f"part-{index}-of-{parts}.npz")


def read_manifest(export_dir):
    """The manifest dict; ExportError naming the file when it is missing, unreadable or of another format."""
    path = os.path.join(export_dir, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file (is {export_dir} an export written by tf_fusedrec.export?)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: cannot be read: {e}") from None
    if manifest.get("format") != FORMAT:
        raise ExportError(f"{path}: format {manifest.get('format')!r}, this tf_fusedrec reads {FORMAT!r}")
    return manifest


def check_file(export_dir, entry):
    """Checks a manifest file entry ({"path", "bytes", "sha256"}); -> its absolute path."""
    path = os.path.join(export_dir, entry["path"])
    if not os.path.isfile(path):
        raise ExportError(f"{path}: missing (listed in the manifest)")
    size = os.path.getsize(path)
    if size != entry["bytes"]:
        raise ExportError(f"{path}: {size} bytes, the manifest says {entry['bytes']}")
    if sha256_of(path) != entry["sha256"]:
        raise ExportError(f"{path}: sha256 differs from the manifest's (the file is corrupt or was changed)")
    return path


def group_of(manifest, name):
    for group in manifest["groups"]:
        if group["name"] == name:
            return group
    raise ExportError(f"the export has no group {name!r} (groups: {[g['name'] for g in manifest['groups']]})")


def _positions_in(sorted_keys, keys):
    """int64 positions in sorted_keys (sorted, distinct) of those of keys it holds."""
    if not len(sorted_keys) or not len(keys):
        return np.zeros(0, np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return at[sorted_keys[at] == keys]


class GroupRows:
    """The rows of one group whose routes lie in a range, in memory, sorted by key.

    Args:
      export_dir / manifest: the export.
      group: the manifest's group dict.
      start, end: the routing range held (default: all of it).
    """

    def __init__(self, export_dir, manifest, group, start=0, end=HASH_SPACE):
        self.group = group
        self.name, self.dim = group["name"], group["dim"]
        self.start, self.end = start, end
        keys, rows = [], []
        for part in group["parts"]:
            if part["end"] <= start or part["start"] >= end:
                continue  # no overlap with the range held
            path = check_file(export_dir, part)
            with np.load(path) as z:
                k, r = z["keys"], z["rows"]
            if k.dtype != np.int64 or r.dtype != np.float32 or r.shape != (len(k), self.dim):
                raise ExportError(f"{path}: expected keys int64 [K] and rows float32 [K, {self.dim}], got "
                                  f"{k.dtype} {k.shape} and {r.dtype} {r.shape}")
            held = in_range(route(k), start, end)
            keys.append(k[held])
            rows.append(r[held])
        keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        rows = np.concatenate(rows) if rows else np.zeros((0, self.dim), np.float32)
        order = np.argsort(keys, kind="stable")
        self.keys, self.rows = keys[order], rows[order]
        if len(self.keys) > 1 and np.any(self.keys[1:] == self.keys[:-1]):
            raise ExportError(f"group {self.name}: a key appears twice in the export's parts")

    @classmethod
    def from_arrays(cls, group, keys, rows, start=0, end=HASH_SPACE):
        """A GroupRows holding `keys` (int64 [K], sorted, distinct) and `rows` (float32 [K, dim]) as they are."""
        held = cls.__new__(cls)
        held.group, held.name, held.dim = group, group["name"], group["dim"]
        held.start, held.end = start, end
        held.keys, held.rows = keys, rows
        return held

    def applied(self, removed, keys, rows, full=False):
        """A new GroupRows: this one's rows (none if full) without the `removed` keys, then with `keys` (int64 [n])
        set to `rows` (float32 [n, dim]; a key given twice takes its last row). -> (new GroupRows, rows added or
        replaced, rows removed). This one is left as it is (readers may hold it).

        Costs a copy of the rows held and (removed + n) binary searches in them, no sort of the rows held: a
        server applies every published version's delta (a few hundred thousand rows) to a million rows or more."""
        removed = np.asarray(removed, np.int64)
        keys = np.asarray(keys, np.int64)
        rows = np.asarray(rows, np.float32).reshape(-1, self.dim)
        base_keys = np.zeros(0, np.int64) if full else self.keys
        base_rows = np.zeros((0, self.dim), np.float32) if full else self.rows
        keep = np.ones(len(base_keys), bool)
        keep[_positions_in(base_keys, removed)] = False
        dropped = int(len(base_keys) - keep.sum())
        if len(keys):
            # The last row of a key given twice: unique over the reversed keys finds each key's last position; the
            # keys come out sorted.
            last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]
            keys, rows = keys[last], rows[last]
            keep[_positions_in(base_keys, keys)] = False
        kept_keys, kept_rows = base_keys[keep], base_rows[keep]
        # Both sorted: each new key goes where it belongs among the kept ones (np.insert merges in one copy).
        at = np.searchsorted(kept_keys, keys)
        merged_keys = np.insert(kept_keys, at, keys)
        merged_rows = np.insert(kept_rows, at, rows, axis=0)
        return (GroupRows.from_arrays(self.group, merged_keys, merged_rows, self.start, self.end), len(keys), dropped)

    def __len__(self):
        return len(self.keys)

    @property
    def nbytes(self):
        return self.keys.nbytes + self.rows.nbytes

    def keys_of(self, ids, categories):
        return table_keys(ids, categories, len(self.group["features"]), self.group["encoding"])

    def lookup(self, ids, categories):
        """float32 [n, dim] rows of (id, category) pairs: the trained row, or the initializer's for ids never trained.
        Returns (rows, number of pairs not held)."""
        ids = np.asarray(ids, np.int64)
        keys = self.keys_of(ids, categories)
        position = np.searchsorted(self.keys, keys)
        position = np.minimum(position, max(len(self.keys) - 1, 0))
        found = (self.keys[position] == keys) if len(self.keys) else np.zeros(len(keys), bool)
        rows = np.empty((len(keys), self.dim), np.float32)
        rows[found] = self.rows[position[found]]
        missing = ~found
        if missing.any():
            rows[missing] = initial_rows(self.group["initializer"], self.group["salts"], ids[missing],
                                         np.asarray(categories)[missing], self.dim)
        return rows, int(missing.sum())


def write_group(export_dir, group, keys, rows, parts):
    """Writes a group's rows as `parts` files split by route range; -> the group dict with "rows" and "parts".

    Args:
      group: the manifest's group dict without "rows" and "parts" (name, dim, encoding, features, salts,
        initializer).
      keys: int64 [K] unique table keys; rows: float32 [K, dim].
      parts: number of files (ranges of equal width).
    """
    keys = np.asarray(keys, np.int64)
    rows = np.asarray(rows, np.float32)
    if rows.shape != (len(keys), group["dim"]):
        raise ValueError(f"group {group['name']}: rows must be [{len(keys)}, {group['dim']}], got {rows.shape}")
    routes = route(keys)
    entries = []
    for i, (start, end) in enumerate(even_ranges(parts)):
        held = in_range(routes, start, end)
        order = np.argsort(keys[held], kind="stable")
        rel = part_name(group["name"], i, parts)
        path = os.path.join(export_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(path, keys=keys[held][order], rows=rows[held][order])
        entries.append({"path": rel, "start": start, "end": end, "rows": int(held.sum()),
                        "bytes": os.path.getsize(path), "sha256": sha256_of(path)})
    return {**group, "rows": int(len(keys)), "parts": entries}


def write_manifest(export_dir, manifest):
    """Writes manifest.json (last: an export without one is incomplete)."""
    manifest = {"format": FORMAT, **manifest}
    tmp = os.path.join(export_dir, ".manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(export_dir, "manifest.json"))
    return manifest

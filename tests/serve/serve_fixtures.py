"""A small fake export written with NumPy only (format.write_group / write_manifest), for the serving tests.

Two groups, both with the Hashed initializer (so rows of ids never trained are reproducible and non-zero):
  "packed": features a, b (dim 4), packed table keys;
  "hashed": features c, d, e (dim 8), hashed table keys.
Each holds `keys_per_feature` trained random ids per feature with random rows, written as `parts` route-range parts.
The manifest's features and dense entries are placeholders: the embedding servers read only the groups.
"""

import os

import numpy as np

from tf_fusedrec import initializers
from tf_fusedrec.export import format as fmt

INITIALIZER = {"class_name": "Hashed", "config": {"seed": 0, "stddev": 0.05}}
GROUPS = (("packed", "packed", ("a", "b"), 4), ("hashed", "hashed", ("c", "d", "e"), 8))
# Trained ids lie in [0, ID_SPACE); tests draw untrained ids from above it.
ID_SPACE = 1 << 20


def fake_tables(keys_per_feature=700, seed=0):
    """The fake export's tables: {group: (group dict without rows/parts, trained ids int64 [K], their categories
    int64 [K], table keys int64 [K], rows float32 [K, dim])}; the same for the same arguments."""
    rng = np.random.default_rng(seed)
    tables = {}
    for name, encoding, feature_names, dim in GROUPS:
        spec = {"name": name, "dim": dim, "encoding": encoding, "features": list(feature_names),
                "salts": [initializers.feature_salt(INITIALIZER["config"]["seed"], f) for f in feature_names],
                "initializer": INITIALIZER}
        ids = np.concatenate([rng.choice(ID_SPACE, keys_per_feature, replace=False) for _ in feature_names])
        categories = np.repeat(np.arange(len(feature_names), dtype=np.int64), keys_per_feature)
        keys = fmt.table_keys(ids, categories, len(feature_names), encoding)
        if len(np.unique(keys)) != len(keys):
            raise ValueError(f"group {name}: the fixture's random ids gave two equal table keys (change the seed)")
        rows = rng.normal(0.0, 0.05, (len(keys), dim)).astype(np.float32)  # the scale of trained rows
        tables[name] = (spec, ids.astype(np.int64), categories, keys, rows)
    return tables


def write_fake_export(export_dir, keys_per_feature=700, parts=3, seed=0):
    """Writes the fake export into export_dir (created); -> export_dir.

    Args:
      export_dir: where to write.
      keys_per_feature: trained ids per feature.
      parts: route-range parts per group.
      seed: of the random ids and rows (fake_tables(keys_per_feature, seed) gives the same tables).
    """
    os.makedirs(export_dir, exist_ok=True)
    groups, features = [], []
    for spec, _, _, keys, rows in fake_tables(keys_per_feature, seed).values():
        groups.append(fmt.write_group(export_dir, spec, keys, rows, parts))
        features += [{"name": f, "dim": spec["dim"], "combiner": "sum", "group": spec["name"], "category": c}
                     for c, f in enumerate(spec["features"])]
    fmt.write_manifest(export_dir, {"features": features, "groups": groups, "dense": {},
                                    "source": {"fixture": "tests/serve/serve_fixtures.py", "seed": seed}})
    return export_dir

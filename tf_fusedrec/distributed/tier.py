"""Tables larger than memory: ``FusedEmbedding(..., tier=fr.Tiered(dram_bytes, path))``.

Each native table of the layer keeps, on each worker, at most ``dram_bytes`` of its entries (key, row, optimizer
slots and access stats) in DRAM and the rest in a RocksDB store on local disk under ``path``, one directory per table
and rank (``path/<table>/rank<r>``). A training lookup reads the step's keys held on disk into DRAM in one batched
read, evicting the least recently used rows (written back in one batch), and the optimizer updates rows in place in
DRAM: the table trains exactly as an all-DRAM one (cc/kernels/native_table_op.cc, TieredStore). The store is scratch
space, created empty when the table is and removed with it; checkpoints (fr.train.Checkpointer) hold every row, cached
or stored, and restore onto any worker count, tiered or not.

DRAM use: the cache's arrays are sized once, to the largest power-of-two capacity whose arrays fit in dram_bytes, and
hold up to 3/4 of that capacity in rows (so 3/8 to 3/4 of dram_bytes is rows); RocksDB adds a bounded 32 MiB block
cache and up to 2 x 32 MiB of write buffers per table (impl/disk_store.h), and a tracked change to a row on disk
(while publishing) about 32 bytes. RocksDB's shared library (Debian: librocksdb-dev) is loaded when a tiered table is
created; the op library itself does not need it.
"""

import dataclasses
import os
import re

# Per table and worker, on top of dram_bytes: RocksDB's block cache and its two write buffers (impl/disk_store.h).
STORE_OVERHEAD_BYTES = 3 * (32 << 20)


@dataclasses.dataclass(frozen=True)
class Tiered:
    """Tiered storage for FusedEmbedding's native tables (module docstring).

    Args:
      dram_bytes: DRAM for each table's entries on each worker (> 0); the rest of the table lives on disk.
      path: a local directory for the on-disk stores (one subdirectory per table and rank, created empty and removed
        with the table); a fast local SSD, not a network filesystem.
    """

    dram_bytes: int
    path: str

    def __post_init__(self):
        if isinstance(self.dram_bytes, bool) or not isinstance(self.dram_bytes, int) or self.dram_bytes <= 0:
            raise ValueError(f"Tiered: dram_bytes must be an int > 0 (bytes), got {self.dram_bytes!r}")
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise ValueError(f"Tiered: path must be a directory path, got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))

    def table_path(self, table_name, rank):
        """The store directory of one table on worker `rank`."""
        return os.path.join(self.path, re.sub(r"[^A-Za-z0-9_.-]", "_", table_name), f"rank{int(rank)}")

    def get_config(self):
        return {"dram_bytes": int(self.dram_bytes), "path": self.path}


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(value, what):
    """An int of bytes, or a string such as "512MiB", "1.5GiB" or "2GB" (binary and decimal units) -> int > 0;
    ValueError naming `what` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = value, ""
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(value)) if isinstance(value, str) else None
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{what}: expected bytes, an int or a size such as 512MiB or 2GiB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{what}: must be > 0 bytes, got {value!r}")
    return size


def parse_tier(tier, owner):
    """None, a Tiered or its config dict -> None or a Tiered; ValueError naming owner otherwise."""
    if tier is None or isinstance(tier, Tiered):
        return tier
    if isinstance(tier, dict):
        unknown = sorted(set(tier) - {"dram_bytes", "path"})
        if unknown or "dram_bytes" not in tier or "path" not in tier:
            raise ValueError(f"{owner}: tier takes dram_bytes and path, got {sorted(tier)}")
        try:
            return Tiered(parse_bytes(tier["dram_bytes"], f"{owner}: tier.dram_bytes"), tier["path"])
        except ValueError as e:
            raise ValueError(f"{owner}: {e}") from None
    raise ValueError(f"{owner}: tier must be None, an fr.Tiered or a dict of its fields, got {tier!r}")

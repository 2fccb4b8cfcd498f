"""The `data.sequences` section of an experiment config: its schema and defaults.

Apart from the experiment schema (tf_fusedrec/config.py) so that the sequence sources (tf_fusedrec/data/sequences.py,
movielens_seq.py), whose specs take their defaults from it, need not import the config module, which checks a
config's sequence section against those specs: config imports the data modules, never the other way round.
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass
class SequenceConfig:
    """``data.sequences`` of a sequence source, or of a file source of sequences (the details:
    tf_fusedrec/data/sequences.py, movielens_seq.py, files.py).

    feature: the sequence feature (ragged ids, embedded with combiner null); the other features are context
      features, one id per user. target: the context feature that is a candidate item, or null.
    median_length, length_sigma, longest_length, empty_fraction: the long-tailed length law (log-normal, bounded) of
      grm_synthetic; movielens_seq and the file sources reject them (config.SYNTHETIC_LENGTH_KEYS: their lengths are
      the data's).
    max_length: the cap; a longer sequence is an error unless truncate: true (keeps the last max_length items).
    """

    feature: str = "items"  # the sequence feature (ragged ids, combiner null); the others are context features
    target: Optional[str] = None  # the context feature that is a candidate item, or null
    median_length: float = 32.0  # grm_synthetic: the median of the non-empty lengths (log-normal, bounded)
    length_sigma: float = 1.0  # grm_synthetic: the log-normal's sigma (the tail knob), >= 0
    longest_length: int = 1600  # grm_synthetic: the bound on lengths, >= median_length
    empty_fraction: float = 0.0  # grm_synthetic: the fraction of users with an empty sequence, in [0, 1)
    max_length: int = 2048  # the cap: a longer sequence is an error unless truncate
    truncate: bool = False  # a longer sequence keeps its last max_length items

"""The row digests delta checkpoints of tables in part files diff against (tf_fusedrec/train/checkpoint.py:
_row_digests, _digest_changes), against an exact bitwise comparison in NumPy."""

import numpy as np
import pytest

from tf_fusedrec.train import checkpoint as ck


def entries(rng, k, dim, slots):
    return rng.standard_normal((k, dim)).astype(np.float32), [rng.standard_normal((k, dim)).astype(np.float32)
                                                              for _ in range(slots)]


@pytest.mark.parametrize("dim, slots", [(1, 0), (4, 1), (16, 2), (33, 3)])
def test_any_one_word_changed_changes_the_digest(dim, slots):
    rng = np.random.default_rng(dim)
    rows, slot_values = entries(rng, 500, dim, slots)
    base = ck._row_digests(rows, slot_values)
    np.testing.assert_array_equal(base, ck._row_digests(rows.copy(), [v.copy() for v in slot_values]))
    assert len(np.unique(base)) == len(base)
    for trial in range(200):  # one bit of one word of one part, each a different row
        r, part, col, bit = rng.integers(500), rng.integers(1 + slots), rng.integers(dim), rng.integers(32)
        changed_rows, changed_slots = rows.copy(), [v.copy() for v in slot_values]
        target = changed_rows if part == 0 else changed_slots[part - 1]
        target.view(np.uint32)[r, col] ^= np.uint32(1) << np.uint32(bit)
        after = ck._row_digests(changed_rows, changed_slots)
        assert after[r] != base[r], (trial, r, part, col, bit)
        assert np.array_equal(np.delete(after, r), np.delete(base, r))


def test_bit_patterns_not_values():
    """-0.0 and 0.0 differ, a NaN equals the same NaN (as the whole-row comparison's _same_bits)."""
    rows = np.array([[0.0], [-0.0], [np.nan], [np.nan]], np.float32)
    d = ck._row_digests(rows, [])
    assert d[0] != d[1] and d[2] == d[3]


def test_digests_in_blocks_equal_one_block(monkeypatch):
    rng = np.random.default_rng(3)
    rows, slot_values = entries(rng, 1000, 8, 2)
    whole = ck._row_digests(rows, slot_values)
    monkeypatch.setattr(ck, "DIGEST_BLOCK", 7)
    np.testing.assert_array_equal(ck._row_digests(rows, slot_values), whole)


def test_digest_changes_against_the_exact_comparison():
    """_digest_changes over a chunk in any order, and the removed keys, equal what ck.changes (bit for bit on the
    rows) finds, for new, changed, unchanged and removed keys."""
    rng = np.random.default_rng(5)
    keys = np.sort(rng.choice(10_000, 400, replace=False)).astype(np.int64)
    rows, (slot,) = entries(rng, 400, 4, 1)
    previous = ck.TableState(keys, rows, ((slot, np.ones(400, bool)),))
    now_keys = np.concatenate([keys[50:], np.arange(20_000, 20_030)])  # 50 removed, 30 new
    now_rows, now_slot = np.concatenate([rows[50:], rows[:30]]), np.concatenate([slot[50:], slot[:30]])
    now_rows[rng.choice(350, 40, replace=False)] += 1.0  # 40 changed rows
    now_slot[rng.choice(350, 10, replace=False), 2] = -0.0  # slots changed (or not, where already -0.0)
    order = rng.permutation(len(now_keys))
    now = ck.TableState(now_keys[order], now_rows[order], ((now_slot[order], np.ones(len(order), bool)),))
    want_changed, want_removed = ck.changes(previous, now)
    held = np.zeros(len(keys), bool)
    got = ck._digest_changes(ck._digest_state(previous), now.keys, ck._digest_state(now).digests, held)
    np.testing.assert_array_equal(got, want_changed)
    np.testing.assert_array_equal(keys[~held], want_removed)
    assert 70 <= got.sum() <= 80 and len(want_removed) == 50


def test_digest_changes_from_nothing():
    held = np.zeros(0, bool)
    got = ck._digest_changes(ck.DigestState(np.zeros(0, np.int64), np.zeros(0, np.uint64)),
                             np.arange(5, dtype=np.int64), np.zeros(5, np.uint64), held)
    assert got.all()

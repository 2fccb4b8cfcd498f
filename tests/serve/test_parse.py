"""The ranker's request parser: parse_request (orjson straight into id arrays, ranker.parse_arrays) against the
reference, parse_body (json.loads with a Python call per integer, the parser the ranker used before).

For every body, random or an edge case, both go through what the ranker does next with each id feature
(model.flatten_ids, no padding) and must end the same way: equal FlatIds and dense columns, or the same error class
and message (the 400 or 413 the client gets). The well-formed random bodies must take the array path, so that the
comparison is not the reference against itself.
"""

import json
import random

import numpy as np
import pytest

from tf_fusedrec.serve import ranker as ranker_lib
from tf_fusedrec.serve.model import InputError, RaggedIds, flatten_ids

# A model's inputs as the parser and flatten_ids see them: one-hot, bag and sequence id features, one dense input.
FEATURES = [
    {"name": "user", "layout": "one", "key_dtype": "int64", "max_id_bits": None},
    {"name": "small", "layout": "one", "key_dtype": "int32", "max_id_bits": 12},
    {"name": "tags", "layout": "bag", "key_dtype": "int64", "max_id_bits": None},
    {"name": "history", "layout": "sequence", "key_dtype": "int64", "max_id_bits": 40},
]
ID_NAMES = [f["name"] for f in FEATURES]
DENSE_NAMES = ["dense"]
LIMITS = {"max_instances": 32, "max_ids": 400, "values_per_instance": 64}


def run(parse, body):
    """(what parse and flatten_ids made of body) or ("error", class name, message)."""
    try:
        columns, shape = parse(body)
        flats = {f["name"]: flatten_ids(f, columns[f["name"]], allow_padding=False) for f in FEATURES}
    except InputError as e:  # TooLarge is one
        return ("error", type(e).__name__, str(e))
    except KeyError as e:  # a missing feature: the model's check_names names it; both parsers must agree
        return ("error", "KeyError", str(e))
    return shape, flats, {name: columns[name] for name in DENSE_NAMES if name in columns}


def served(body):
    return ranker_lib.parse_request(body, ID_NAMES, DENSE_NAMES, **LIMITS)


def reference(body):
    return ranker_lib.parse_body(body, **LIMITS)


def assert_same(body):
    got, want = run(served, body), run(reference, body)
    if want[0] == "error" or got[0] == "error":
        assert got == want, body[:300]
        return
    assert got[0] == want[0]
    for name in ID_NAMES:
        for a, b in zip(got[1][name], want[1][name]):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: {body[:300]!r}")
    assert got[2] == want[2], body[:300]
    for name in DENSE_NAMES:  # the float32 inputs the model gets (model._dense_value's conversion)
        if name in want[2]:
            a, b = as_float32(got[2][name]), as_float32(want[2][name])
            assert type(a) is type(b), body[:300]
            assert a == b if isinstance(a, str) else np.array_equal(a, b, equal_nan=True), body[:300]


def as_float32(value):
    try:
        with np.errstate(over="ignore"):  # values beyond float32 become inf, as in the model's conversion
            return np.asarray(value, np.float32)
    except (TypeError, ValueError) as e:
        return str(e)


def random_instances(rng, n):
    def id_value(feature):
        top = {"user": 1 << 62, "small": 1 << 12, "tags": 1 << 30, "history": 1 << 40}[feature]
        return rng.choice([0, top - 1, rng.randrange(top), rng.randrange(100)])

    instances = []
    for _ in range(n):
        instances.append({
            "user": id_value("user"),
            "small": id_value("small") if rng.random() < 0.7 else [id_value("small")],
            "tags": [id_value("tags") for _ in range(rng.randrange(6))],
            "history": [id_value("history") for _ in range(rng.randrange(4))] if rng.random() < 0.9 else 7,
            "dense": [rng.choice([rng.gauss(0, 1e3), rng.randrange(-5, 5), 0.1, 1e-320, -0.0, 3.4e-38, 9e18,
                                  rng.random()]) for _ in range(3)],
        })
    return instances


def bodies(instances):
    columns = {name: [inst[name] for inst in instances] for name in instances[0]}
    return [json.dumps({"instances": instances}).encode(), json.dumps({"inputs": columns}).encode()]


@pytest.mark.parametrize("seed", range(40))
def test_random_well_formed_bodies_take_the_array_path_and_equal_the_reference(seed):
    rng = random.Random(seed)
    for body in bodies(random_instances(rng, rng.randrange(1, LIMITS["max_instances"] + 1))):
        parsed = ranker_lib.parse_arrays(body, ID_NAMES, DENSE_NAMES, LIMITS["max_instances"], LIMITS["max_ids"])
        if sum(len(v) if isinstance(v, list) else 1 for inst in json.loads(body).get("instances", [])
               for v in inst.values()) <= LIMITS["max_ids"]:
            assert parsed is not None, body[:300]
            assert isinstance(parsed[0]["tags"], RaggedIds) and parsed[0]["tags"].values.dtype == np.int64
        assert_same(body)


@pytest.mark.parametrize("seed", range(40))
def test_random_corrupted_bodies_end_as_the_reference(seed):
    """One value of a valid body replaced by JSON of another type or range, or its bytes cut or changed."""
    rng = random.Random(1000 + seed)
    base = bodies(random_instances(rng, rng.randrange(1, 6)))[rng.randrange(2)]
    replacements = ["true", "false", "null", '"7"', "1.5", "-1", "[]", "[[]]", "[[1]]", "{}", str(2**63),
                    str(2**64), str(-(2**63) - 1), str(2**63 - 1), "9" * 40, "9" * 5000, "1e400", "NaN", "-Infinity",
                    "[1, true]", "[1, 2.0]", "[" * 60 + "]" * 60, '"\\ud800"', "1E2", "-0", "[-0]"]
    for _ in range(30):
        text = base.decode()
        kind = rng.randrange(3)
        if kind == 0:  # a number replaced
            spots = [i for i, c in enumerate(text) if c.isdigit() and not text[i - 1].isdigit()]
            i = rng.choice(spots)
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] in ".-e+"):
                j += 1
            body = (text[:i] + rng.choice(replacements) + text[j:]).encode()
        elif kind == 1:  # cut
            body = base[:rng.randrange(len(base))]
        else:  # a byte changed
            i = rng.randrange(len(base))
            body = base[:i] + bytes([rng.randrange(256)]) + base[i + 1:]
        assert_same(body)


def one(**change):
    instance = {"user": 1, "small": 2, "tags": [3, 4], "history": [5], "dense": [0.5, 1.0, 2.0]}
    instance.update(change)
    return instance


EDGE = {
    "empty lists": json.dumps({"instances": [one(tags=[], history=[]), one(tags=[])]}),
    "all empty": json.dumps({"inputs": {"user": [1], "small": [2], "tags": [[]], "history": [[]],
                                        "dense": [[0.0, 0.0, 0.0]]}}),
    "int64 max": json.dumps({"instances": [one(user=2**63 - 1)]}),
    "2**63": json.dumps({"instances": [one(user=2**63)]}),
    "2**64 in a list": json.dumps({"instances": [one(tags=[1, 2**64])]}),
    "2**64 - 1": json.dumps({"instances": [one(tags=[2**64 - 1])]}),
    "below int64": json.dumps({"instances": [one(user=-(2**63) - 1)]}),
    "30 digits": json.dumps({"instances": [one(tags=[10**30])]}),
    "5000 digits": json.dumps({"instances": [one(history=[1])]}).replace("[1]", "[" + "9" * 5000 + "]"),
    "dense out of int64": json.dumps({"instances": [one(dense=[2**64, 1, 2])]}),
    "dense 5000 digits": json.dumps({"instances": [one()]}).replace("[0.5, 1.0, 2.0]", "[" + "9" * 5000 + ", 1, 2]"),
    "dense ints": json.dumps({"instances": [one(dense=[1, 2, 3])]}),
    "bool id": json.dumps({"instances": [one(user=True)]}),
    "bool in a list": json.dumps({"instances": [one(tags=[1, False])]}),
    "float id": json.dumps({"instances": [one(small=1.0)]}),
    "string id": json.dumps({"instances": [one(tags=["1"])]}),
    "null id": json.dumps({"instances": [one(user=None)]}),
    "object id": json.dumps({"instances": [one(user={})]}),
    "nested lists": json.dumps({"instances": [one(tags=[[1], [2]])]}),
    "nested 200": json.dumps({"instances": [one()]}).replace('"tags": [3, 4]', '"tags": ' + "[" * 200 + "]" * 200),
    "nested 2000": "[" * 2000 + "]" * 2000,
    "negative": json.dumps({"instances": [one(history=[-1])]}),
    "too large for max_id_bits": json.dumps({"instances": [one(small=4096)]}),
    "one layout given two": json.dumps({"instances": [one(user=[1, 2])]}),
    "dense NaN": json.dumps({"instances": [one(dense=[float("nan"), 1.0, 2.0])]}),
    "dense short": json.dumps({"instances": [one(dense=[1.0])]}),
    "dense nested": json.dumps({"instances": [one(dense=[[1.0], [2.0], [3.0]])]}),
    "unknown feature": json.dumps({"instances": [one(colour=1)]}),
    "missing feature": json.dumps({"instances": [{k: v for k, v in one().items() if k != "tags"}]}),
    "uneven instances": json.dumps({"instances": [one(), {k: v for k, v in one().items() if k != "tags"}]}),
    "extra key": json.dumps({"instances": [one()], "signature_name": "serving_default"}),
    "both shapes": json.dumps({"instances": [one()], "inputs": {}}),
    "duplicate key": '{"instances": [' + json.dumps(one())[:-1] + ', "user": 9}]}',
    "no instances": json.dumps({"instances": []}),
    "not a list": json.dumps({"instances": one()}),
    "instance not an object": json.dumps({"instances": [1]}),
    "inputs uneven lengths": json.dumps({"inputs": {"user": [1, 2], "small": [2], "tags": [[1]], "history": [[1]],
                                                    "dense": [[0.0, 0.0, 0.0]]}}),
    "inputs empty column": json.dumps({"inputs": {"user": [], "small": [], "tags": [], "history": [],
                                                  "dense": []}}),
    "too many instances": json.dumps({"instances": [one()] * (LIMITS["max_instances"] + 1)}),
    # one() holds 3 ids besides its tags.
    "ids at max_ids": json.dumps({"instances": [one(tags=list(range(LIMITS["max_ids"] - 3)))]}),
    "ids beyond max_ids": json.dumps({"instances": [one(tags=list(range(LIMITS["max_ids"] - 2)))]}),
    "dense int beyond max_ids": json.dumps({"instances": [one(tags=list(range(LIMITS["max_ids"] - 3)),
                                                              dense=[1, 0.5, 0.5])]}),
    # The reference counts an integer literal outside int64 as an id wherever it is; orjson reads it as a float.
    "dense 2**64 beyond max_ids": json.dumps({"instances": [one(tags=list(range(LIMITS["max_ids"] - 3)),
                                                                dense=[2**64, 0.5, 0.5])]}),
    "too many values": json.dumps({"instances": [one(dense=[0.5] * 5000)]}),
    "not an object": "[1, 2]",
    "not json": "{not json",
    "empty": "",
    "trailing data": json.dumps({"instances": [one()]}) + " x",
    "lone surrogate": json.dumps({"instances": [one()]}).replace('"user"', '"\\ud800"'),
}
RAW = {
    "non-UTF-8": b'{"instances": [{"user": 1, "\xff": 2}]}',
    "non-UTF-8 in a string value": json.dumps({"instances": [one(user="x")]}).encode().replace(b'"x"', b'"\xc0\xaf"'),
    "UTF-8 BOM": b"\xef\xbb\xbf" + json.dumps({"instances": [one()]}).encode(),
    "UTF-16": json.dumps({"instances": [one()]}).encode("utf-16"),
    "NUL byte": b'{"instances": [\x00]}',
}


@pytest.mark.parametrize("name", sorted(EDGE) + sorted(RAW))
def test_edge_bodies_end_as_the_reference(name):
    body = RAW[name] if name in RAW else EDGE[name].encode()
    assert_same(body)
    if name in RAW:
        return
    if name in ("empty lists", "all empty", "int64 max", "ids at max_ids",
                "dense ints", "negative", "too large for max_id_bits", "one layout given two", "dense short",
                "duplicate key"):
        # Well-formed for the parser (the model's checks refuse some): the array path takes them.
        assert ranker_lib.parse_arrays(body, ID_NAMES, DENSE_NAMES, LIMITS["max_instances"], LIMITS["max_ids"])


def test_the_errors_clients_see():
    """A few of the answers above spelled out: the messages of the HTTP 400s and 413s."""
    cases = {
        "2**64 in a list": "feature 'tags': ids must be integers, got 18446744073709551616 (outside int64",
        "bool id": "feature 'user': ids must be integers, got True",
        "nested 2000": "the request body nests JSON arrays or objects too deeply",
        "ids beyond max_ids": f"the request holds more than {LIMITS['max_ids']} ids (--max-ids)",
        "dense int beyond max_ids": f"the request holds more than {LIMITS['max_ids']} ids (--max-ids)",
        "dense 2**64 beyond max_ids": f"the request holds more than {LIMITS['max_ids']} ids (--max-ids)",
        "5000 digits": "feature 'history': ids must be integers, got an integer literal of 5000 digits",
        "negative": "feature 'history': ids must be >= 0; found -1",
    }
    for name, message in cases.items():
        outcome = run(served, EDGE[name].encode())
        assert outcome[0] == "error" and message in outcome[2], (name, outcome)
    outcome = run(served, RAW["non-UTF-8"])
    assert outcome[0] == "error" and "not valid JSON" in outcome[2], outcome


@pytest.mark.parametrize("seed", range(20))
def test_flatten_without_padding_equals_the_padding_path(seed):
    # allow_padding=False (the ranker's requests) skips the search for padding once every id is checked >= 0: on ids
    # without padding it must give what the padding path gives, field by field; an id of -1 is an error there.
    rng = np.random.default_rng(seed)
    b = int(rng.integers(0, 6))
    lengths = rng.integers(0, 4, b)
    values = rng.integers(0, 1000, int(lengths.sum()))
    inputs = {
        "1-D array": rng.integers(0, 1000, b),
        "2-D array": rng.integers(0, 1000, (b, 3)),
        "ragged ids": RaggedIds(values, lengths),
        "list of lists": [list(map(int, values[s - n:s])) for s, n in zip(np.cumsum(lengths), lengths)],
        "list of ids": [int(x) for x in rng.integers(0, 1000, b)],
    }
    feature = {"name": "f", "layout": "bag", "key_dtype": "int64", "max_id_bits": None}
    for what, value in inputs.items():
        if what == "list of lists" and not any(lengths):
            continue  # an empty list per instance reads as a list of ids
        want, got = flatten_ids(feature, value, allow_padding=True), flatten_ids(feature, value, allow_padding=False)
        assert got.num_rows == want.num_rows, what
        for field in ("ids", "rows_of", "positions", "lengths"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{what}: {field}")
            assert getattr(got, field).dtype == np.int64, (what, field)
        if what in ("1-D array", "list of ids"):
            one = flatten_ids(dict(feature, layout="one"), value, allow_padding=False)
            np.testing.assert_array_equal(one.rows_of, np.arange(b), err_msg=what)
    if b:
        padded = rng.integers(0, 1000, (b, 3))
        padded[0, 1] = -1
        with pytest.raises(InputError, match="ids must be >= 0; found -1"):
            flatten_ids(feature, padded, allow_padding=False)
        assert len(flatten_ids(feature, padded, allow_padding=True).ids) == 3 * b - 1

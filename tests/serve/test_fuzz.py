"""Malformed requests, a few thousand, to the ranker (HTTP bodies) and the embedding servers (protobuf over gRPC).

The trained scenario model is served as in production, all in this process and on loopback: 2 embedding servers
(EmbeddingServer, even ranges of 2) and the ranker built from its flags, its rows from those servers (no cache, so
every prediction crosses them). A prediction is taken first; then, from a fixed seed and bounded in count and time:

* HTTP: truncated bodies, bodies with a byte no JSON text may hold, every id feature and the dense input given values
  of the wrong type, out of int64, negative, oversized or nested, and malformed request structures and sizes. Every
  answer must be a 4xx whose JSON error names the problem (the feature, the input or the flag where the case knows it).
* gRPC: Lookup requests cut short, with bits flipped, bytes inserted, random bytes, and entries that are wrong field
  by field; Credits and Info requests of random bytes. Every answer must be INVALID_ARGUMENT with details naming the
  problem, or, for bytes that happen to make a valid request, the right rows (checked against LocalBackend).

Afterwards the ranker still answers the first prediction, equal to what it answered before and to the in-process model,
and neither the ranker nor the servers answered anything but the above (no 5xx, no UNKNOWN).
"""

import collections
import http.client
import json
import random
import time

import grpc
import numpy as np
import pytest

from tests.serve import serve_fixtures
from tests.serve.serve_fixtures import instances_of, post

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from tf_fusedrec.serve import embedding_pb2 as pb  # noqa: E402
from tf_fusedrec.serve import embedding_server  # noqa: E402
from tf_fusedrec.serve.backend import LocalBackend  # noqa: E402

sc = serve_fixtures.scenario()

SEED = 22
HTTP_CASES = 2000
LOOKUP_CASES = 1600
CONTROL_CASES = 200  # each of Credits and Info
DEADLINE_S = 40  # each part (HTTP, gRPC) stops sending here, whatever is left of its counts
LIMITS = {"max_instances": 16, "max_ids": 2048, "max_body_mb": 0.25}
TOKEN = "@@FUZZ@@"  # a value replaced by raw JSON text after json.dumps

# Feature values (JSON text) no id feature takes; each is refused naming the feature.
BAD_IDS = ['"x"', "1.5", "null", "true", "{}", "[[1]]", "-1", "-7", str(2**63), str(2**64), str(-(2**63) - 1),
           "9" * 5000, "1e5", "NaN", '"1"', '[1, "a"]', "[-1]", "[2.5]", "[" * 50 + "]" * 50, "[null]", "[{}]",
           "[1e400]", "[" + "9" * 30 + "]"]
# Values the dense input ([B, 3] float32) does not take.
BAD_DENSE = ['"x"', "[1, 2]", "[1, 2, 3, 4]", "NaN", "[NaN, 1, 2]", "[1e999, 1, 2]", "[[1, 2, 3]]", "null", "{}",
             '["a", 1, 2]', "[" + "9" * 5000 + ", 1, 2]", "[[1], [2], [3]]", "[Infinity, 0, 0]"]
# Bytes no JSON text holds outside or inside a string (control characters, never-valid UTF-8).
BAD_BYTES = [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0xC0, 0xC1, *range(0xF5, 0x100)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    export_dir = serve_fixtures.trained_export(tmp_path_factory)
    servers = [embedding_server.EmbeddingServer(export_dir, start, end) for start, end in fmt.even_ranges(2)]
    for server in servers:
        server.start(0)
    addresses = [f"127.0.0.1:{s.port}" for s in servers]
    ranker = serve_fixtures.RankerThread([
        "--export", export_dir, "--servers", ",".join(addresses), "--cache-mb", "0", "--name", "fuzz",
        "--max-instances", str(LIMITS["max_instances"]), "--max-ids", str(LIMITS["max_ids"]),
        "--max-body-mb", str(LIMITS["max_body_mb"]), "--timeout-s", "5"])
    yield {"export": export_dir, "servers": servers, "addresses": addresses, "ranker": ranker,
           "local": fr.export.load_model(export_dir), "rows": LocalBackend(export_dir)}
    ranker.close()
    for server in servers:
        server.stop(grace=0)


# --- HTTP bodies ---------------------------------------------------------------------------------------------------


def with_value(instances, index, name, text, columnar=False):
    """The request of `instances` with instance `index`'s value of `name` replaced by the JSON text `text`."""
    instances = [dict(inst) for inst in instances]
    instances[index][name] = TOKEN
    if columnar:
        request = {"inputs": {n: [inst[n] for inst in instances] for n in instances[0]}}
    else:
        request = {"instances": instances}
    return json.dumps(request).replace(f'"{TOKEN}"', text).encode()


def http_cases(rng, features):
    """HTTP_CASES (body, the status expected, a fragment its error must hold or None), from rng."""
    bases = [instances_of(sc.make_batch(1000 + k))[:n] for k in range(4) for n in (1, 2, 4)]
    id_features = [f for f in features if f != "dense"]
    structural = [
        (b"[]", 400, 'exactly one of "instances" or "inputs"'), (b'"x"', 400, "exactly one of"),
        (b"1", 400, "exactly one of"), (b"null", 400, "exactly one of"), (b"{}", 400, "exactly one of"),
        (b'{"instances": []}', 400, "non-empty list"), (b'{"instances": {}}', 400, "non-empty list"),
        (b'{"instances": [1]}', 400, "instance 0 must be an object"), (b'{"inputs": []}', 400, '"inputs" must be'),
        (b'{"inputs": {"user_id": 5}}', 400, "input 'user_id': must be a list"),
        (b'{"instances": [{}], "inputs": {}}', 400, "exactly one of"),
        (b"[" * 1500 + b"]" * 1500, 400, "nests JSON arrays or objects too deeply"),
        (b"", 400, "not valid JSON"), (b"\xef\xbb\xbf{}", 400, "exactly one of"),  # a UTF-8 BOM is allowed
    ]

    def structure(base):
        choice = rng.randrange(8)
        if choice == 0:
            name = rng.choice(id_features)
            without = [{k: v for k, v in inst.items() if k != name} for inst in base]
            return json.dumps({"instances": without}).encode(), 400, f"feature '{name}' is missing"
        if choice == 1:
            return json.dumps({"instances": [dict(inst, colour=1) for inst in base]}).encode(), 400, \
                "unknown feature 'colour'"
        if choice == 2 and len(base) > 1:
            name = rng.choice(id_features)
            changed = [dict(inst) for inst in base]
            changed[rng.randrange(1, len(base))].pop(name)
            return json.dumps({"instances": changed}).encode(), 400, "is given in some instances but not all"
        if choice == 3 and len(base) > 1:
            columns = {n: [inst[n] for inst in base] for n in base[0]}
            name = rng.choice(id_features)
            columns[name] = columns[name][:-1]
            return json.dumps({"inputs": columns}).encode(), 400, f"'{name}' has {len(base) - 1}"
        if choice == 4:
            many = (base * (LIMITS["max_instances"] + 8))[:LIMITS["max_instances"] + 1 + rng.randrange(8)]
            return json.dumps({"instances": many}).encode(), 413, "(--max-instances)"
        if choice == 5:
            changed = [dict(inst) for inst in base]
            changed[0]["tags"] = list(range(LIMITS["max_ids"] + 1))
            return json.dumps({"instances": changed}).encode(), 413, "(--max-ids)"
        if choice == 6:
            return rng.choice(structural)
        # choice 7, and 2 or 3 with a single instance: a body beyond --max-body-mb, sent whole
        return json.dumps({"instances": base}).encode() + b" " * int(LIMITS["max_body_mb"] * (1 << 20)), 413, \
            "--max-body-mb"

    cases = []
    while len(cases) < HTTP_CASES:
        base = rng.choice(bases)
        body = json.dumps({"instances": base}).encode()
        kind = rng.randrange(5)
        if kind == 0:  # cut short: a proper prefix of a JSON object is never JSON
            cases.append((body[:rng.randrange(len(body))], 400, "not valid JSON"))
        elif kind == 1:
            at = rng.randrange(len(body) + 1)
            cases.append((body[:at] + bytes([rng.choice(BAD_BYTES)]) + body[at:], 400, None))
        elif kind == 2:
            name = rng.choice(id_features)
            cases.append((with_value(base, rng.randrange(len(base)), name, rng.choice(BAD_IDS), rng.random() < 0.3),
                          400, f"feature '{name}'"))
        elif kind == 3:
            cases.append((with_value(base, rng.randrange(len(base)), "dense", rng.choice(BAD_DENSE),
                                     rng.random() < 0.3), 400, "input 'dense'"))
        else:
            cases.append(structure(base))
    return cases


def test_fuzz_ranker_and_servers_then_they_still_serve(served):
    rng = random.Random(SEED)
    ranker = served["ranker"]
    reference = instances_of(sc.make_batch(1000))[:6]
    status, answer = post(f"{ranker.url}:predict", {"instances": reference})
    assert status == 200, answer
    before = np.asarray(answer["predictions"], np.float32)
    inputs = {name: [inst[name] for inst in reference] for name in reference[0]}
    np.testing.assert_allclose(before, served["local"].predict(inputs, allow_padding=False), rtol=1e-6, atol=1e-7)
    deadline = time.monotonic() + DEADLINE_S

    failures, sent = [], {"http": 0, "lookup": 0, "credits": 0, "info": 0}
    outcomes = collections.Counter()  # (kind, status or code): in the failure message, and checked for coverage
    connection = http.client.HTTPConnection("127.0.0.1", ranker.port, timeout=30)
    path = "/v1/models/fuzz:predict"
    for body, status, fragment in http_cases(rng, list(inputs)):
        if time.monotonic() > deadline:
            break
        sent["http"] += 1
        try:
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            failures.append(("http: no answer", repr(e), body[:200]))
            continue
        try:
            error = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if response.status != status or not isinstance(error, str) or not error or (
                fragment is not None and fragment not in error):
            failures.append(("http", response.status, status, fragment, error, body[:200]))
        outcomes["http", response.status] += 1
        if response.will_close:
            connection.close()
    connection.close()

    rows = served["rows"]
    groups = {g["name"]: g for g in rows.manifest["groups"]}
    # A deadline of their own: an HTTP part slowed by a busy machine must not leave the gRPC part no case at all (the
    # coverage checks below would then fail).
    deadline = time.monotonic() + DEADLINE_S
    for address, server in zip(served["addresses"], served["servers"]):
        with grpc.insecure_channel(address) as channel:
            calls = {name: channel.unary_unary(method) for name, method in (
                ("lookup", embedding_server.LOOKUP_METHOD), ("credits", embedding_server.CREDITS_METHOD),
                ("info", embedding_server.INFO_METHOD))}
            cases = [("lookup", p) for p in lookup_cases(rng, server, groups, LOOKUP_CASES // 2)]
            cases += [("credits", p) for p in control_cases(rng, pb.CreditsRequest(client_id="ranker-1"))]
            cases += [("info", p) for p in control_cases(rng, pb.InfoRequest())]
            for kind, payload in cases:
                if time.monotonic() > deadline:
                    break
                sent[kind] += 1
                try:
                    answer = calls[kind](payload, timeout=30)
                except grpc.RpcError as e:
                    outcomes[kind, e.code().name] += 1
                    if e.code() != grpc.StatusCode.INVALID_ARGUMENT or not any(
                            word in e.details() for word in ("field", "group", "request", "Request")):
                        failures.append((kind, e.code(), e.details(), payload[:100]))
                    continue
                outcomes[kind, "OK"] += 1
                problem = check_answer(kind, payload, answer, rows)
                if problem:
                    failures.append((kind, "OK", problem, payload[:100]))
    assert not failures, f"{len(failures)} of {sent} cases ({dict(outcomes)}); the first: {failures[:5]}"
    assert outcomes["lookup", "INVALID_ARGUMENT"] > sent["lookup"] // 2, dict(outcomes)  # the fuzz hit the checks

    status, answer = post(f"{ranker.url}:predict", {"instances": reference})
    assert status == 200, answer
    np.testing.assert_array_equal(np.asarray(answer["predictions"], np.float32), before)
    stats = ranker.ranker.stats()
    assert stats["errors_500"] == 0 and stats["errors_503"] == 0, stats
    assert stats["errors_400"] + stats["errors_413"] >= sent["http"], (stats, sent)
    assert sum(s.credits_state().invalid for s in served["servers"]) > sent["lookup"] // 2


# --- gRPC requests -------------------------------------------------------------------------------------------------


def lookup_cases(rng, server, groups, count):
    """`count` malformed (or, by chance, valid) Lookup payloads for `server`, from rng."""
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    templates = []
    for name, group in groups.items():
        ids = nprng.integers(0, 200, 400)
        categories = nprng.integers(0, len(group["features"]), 400)
        routes = fmt.route(fmt.table_keys(ids, categories, len(group["features"]), group["encoding"]))
        held = fmt.in_range(routes, server.range_start, server.range_end)
        ids, categories = ids[held][:20], categories[held][:20]
        segments = nprng.integers(0, 6, len(ids))
        templates.append(pb.GroupLookup(group=name, ids=ids.astype("<i8").tobytes(),
                                        categories=categories.astype("<i4").tobytes()))
        templates.append(pb.GroupLookup(group=name, ids=ids.astype("<i8").tobytes(),
                                        categories=categories.astype("<i4").tobytes(), pool=True,
                                        segments=segments.astype("<i4").tobytes(), num_segments=6))

    def wrong(entry):
        """The entry with one field made wrong."""
        bad = pb.GroupLookup()
        bad.CopyFrom(entry)
        n = len(entry.ids) // 8
        field = rng.randrange(9)
        if field == 0:
            bad.group = rng.choice(["", "nope", entry.group + "x", entry.group.upper(), "é" * 3])
        elif field == 1:
            bad.ids = entry.ids[:-rng.randrange(1, 8)] if entry.ids else b"\x01"
        elif field == 2:
            bad.categories = entry.categories + b"\x00" * rng.randrange(1, 4)
        elif field == 3 and n:
            ids = np.frombuffer(entry.ids, "<i8").copy()
            ids[rng.randrange(n)] = rng.choice([-1, -(2**63), 2**62, 2**63 - 1])
            bad.ids = ids.tobytes()
        elif field == 4 and n:
            categories = np.frombuffer(entry.categories, "<i4").copy()
            categories[rng.randrange(n)] = rng.choice([-1, 3, 7, 2**31 - 1])
            bad.categories = categories.tobytes()
        elif field == 5:
            bad.pool, bad.num_segments = False, 0
            bad.segments = np.zeros(n, "<i4").tobytes() + b"\x00\x00\x00\x00"
        elif field == 6:
            bad.pool = True
            bad.num_segments = rng.choice([-1, -(2**31), 0])
            bad.segments = np.zeros(n, "<i4").tobytes()
        elif field == 7:
            bad.pool, bad.num_segments = True, 6
            bad.segments = np.full(n + rng.randrange(-1, 2) * (n > 0), 6, "<i4").tobytes()
        else:  # ids of the other server's range
            ids = np.arange(1000, 1200)
            categories = np.zeros(200, np.int64)
            group = groups[entry.group]
            routes = fmt.route(fmt.table_keys(ids, categories, len(group["features"]), group["encoding"]))
            outside = ~fmt.in_range(routes, server.range_start, server.range_end)
            bad.ids, bad.categories = ids[outside][:5].astype("<i8").tobytes(), np.zeros(5, "<i4").tobytes()
            bad.pool, bad.segments, bad.num_segments = False, b"", 0
        return bad

    payloads = []
    while len(payloads) < count:
        entries = [rng.choice(templates) for _ in range(rng.randrange(1, 3))]
        valid = pb.LookupRequest(groups=entries).SerializeToString()
        kind = rng.randrange(6)
        if kind == 0:
            payloads.append(valid[:rng.randrange(len(valid))])
        elif kind == 1:
            flipped = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            payloads.append(bytes(flipped))
        elif kind == 2:
            at = rng.randrange(len(valid) + 1)
            payloads.append(valid[:at] + rng.randbytes(rng.randrange(1, 12)) + valid[at:])
        elif kind == 3:
            payloads.append(rng.randbytes(rng.randrange(1, 200)))
        else:
            entries = list(entries)
            entries[rng.randrange(len(entries))] = wrong(rng.choice(entries))
            payloads.append(pb.LookupRequest(groups=entries).SerializeToString())
    return payloads


def control_cases(rng, valid_message):
    """CONTROL_CASES payloads for Credits or Info: random bytes and mutations of a valid request."""
    valid = valid_message.SerializeToString()
    payloads = []
    while len(payloads) < CONTROL_CASES:
        if valid and rng.random() < 0.5:
            mutated = bytearray(valid)
            mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
            payloads.append(bytes(mutated[:rng.randrange(1, len(mutated) + 1)]))
        else:
            payloads.append(rng.randbytes(rng.randrange(1, 64)))
    return payloads


def check_answer(kind, payload, answer, rows):
    """None if an answered request (bytes that happen to make a valid one) got the right answer, else what is wrong."""
    if kind == "credits":
        message = pb.CreditsResponse.FromString(answer)
        return None if message.credits >= 1 else f"credits {message.credits}"
    if kind == "info":
        message = pb.InfoResponse.FromString(answer)
        return None if message.fingerprint and not message.export_dir.startswith("/") else str(message)[:200]
    request, response = pb.LookupRequest.FromString(payload), pb.LookupResponse.FromString(answer)
    if len(response.groups) != len(request.groups):
        return f"{len(response.groups)} results for {len(request.groups)} entries"
    for entry, result in zip(request.groups, response.groups):
        ids, categories = np.frombuffer(entry.ids, "<i8"), np.frombuffer(entry.categories, "<i4")
        dim = result.dim
        if not entry.pool:
            got = np.frombuffer(result.rows, "<f4").reshape(len(ids), dim)
            if not np.array_equal(got, rows.rows(entry.group, ids, categories)):
                return f"group {entry.group}: wrong rows"
            continue
        segments = np.frombuffer(entry.segments, "<i4")
        sums, counts = rows.pooled(entry.group, ids, categories, segments, entry.num_segments)
        present = np.frombuffer(result.segments, "<i4")
        got_sums = np.frombuffer(result.sums, "<f4").reshape(len(present), dim)
        if not (np.allclose(got_sums, sums[present], rtol=1e-6, atol=1e-6)
                and np.array_equal(np.frombuffer(result.counts, "<i4"), counts[present])
                and counts.sum() == len(ids)):
            return f"group {entry.group}: wrong sums or counts"
    return None

"""The client side of tests/cluster/test_serving_tls.py, run on a host of the cluster (its network namespace): the
trainer's seat. Prints one JSON line.

    python tests/cluster/tls_serving_client.py --export EXPORT --ranker HOST:PORT --publish HOST:PORT \
        --tls-cert PEM --tls-key PEM --tls-ca PEM --publish-token-file FILE

1. Predictions of the scenario's batch from the ranker over HTTPS (mutual TLS) against this process's model of the
   export (every row here): the largest difference; and the same request without a client certificate (refused).
2. A publish of version 1 the way the trainer makes one: the ranker's targets, the first rows of every group staged
   (unchanged: the version's predictions stay the export's) and committed on every server, the dense weights installed
   on the ranker; then the versions each server holds and the ranker's predictions again.
"""

import argparse
import json
import os
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.serve import serve_fixtures  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from tf_fusedrec.serve import publish, security  # noqa: E402

ROWS_PER_GROUP = 50


def predict(url, instances, context):
    request = urllib.request.Request(f"{url}:predict", data=json.dumps({"instances": instances}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60, context=context) as r:
        answer = json.loads(r.read())
    return answer["model_version"], np.asarray(answer["predictions"], np.float64)


def served(url, instances, context, want):
    """The ranker's version and how its predictions compare with this process's (`want`)."""
    version, got = predict(url, instances, context)
    got = got.reshape(-1)
    return {"version": version, "count": len(got), "max_abs_diff": float(np.max(np.abs(got - want))),
            "close": bool(got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-7))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--export", required=True)
    p.add_argument("--ranker", required=True)
    p.add_argument("--publish", required=True)
    security.add_tls_flags(p, server=False)
    security.add_publish_auth_flags(p, server=False)
    args = p.parse_args()
    tls = security.TLS.from_args(args)
    token = security.read_token(args.publish_token_file)
    import tf_fusedrec as fr  # noqa: PLC0415  (after the flags: a wrong flag fails before TensorFlow loads)

    local = fr.export.load_model(args.export)
    instances = serve_fixtures.instances_of(serve_fixtures.scenario().make_batch(1000))
    want = np.asarray(local.predict({name: [i[name] for i in instances] for name in instances[0]},
                                    allow_padding=False), np.float64).reshape(-1)
    url = f"https://{args.ranker}/v1/models/model"
    context = tls.client_context()
    report = {}
    report["before"] = served(url, instances, context, want)
    try:  # without a client certificate the ranker (--tls-client-auth) takes no connection
        predict(url, instances[:1], security.TLS(ca=tls.ca).client_context())
        report["without_certificate"] = "answered"
    except OSError as e:
        report["without_certificate"] = f"refused: {type(e).__name__}"

    targets = publish.ranker_targets(args.publish, tls=tls, token=token)
    table = publish.table_of_targets(targets)
    report["servers"] = sorted(table.addresses)
    manifest = fmt.read_manifest(args.export)
    publisher = publish.Publisher(table, timeout_s=30, tls=tls, token=token)
    try:
        for group in manifest["groups"]:
            rows_of = fmt.GroupRows(args.export, manifest, group)
            publisher.stage(1, rows_of.name, rows_of.dim, rows_of.keys[:ROWS_PER_GROUP],
                            rows_of.rows[:ROWS_PER_GROUP], np.zeros(0, np.int64))
        publisher.commit(1, step=11, full=False, keep_from=0)
        report["held"] = {a: None if v is None else sorted(v) for a, v in publisher.versions_held().items()}
    finally:
        publisher.close()
    weights = [v.numpy() for v in local._loaded[0].dense_variables]  # noqa: SLF001  (the export's dense weights)
    report["dense"] = publish.push_dense(args.publish, 1, 11, weights, tls=tls, token=token)
    report["after"] = served(url, instances, context, want)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

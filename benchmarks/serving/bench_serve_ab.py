"""The ranker under open-loop load, alternating load-test variants on the same servers: an A/B on this shared machine.

    .venv/bin/python benchmarks/serving/bench_serve_ab.py --export EXPORT [--setups pooled_cached,plain] [--qps 120,200]
        [--prebuild 0,auto] [--ranker-variant NAME="FLAGS" ...] [--server-variant NAME="FLAGS" ...]
        [--transports plain,tls,mtls] [--repeats 2] [--duration 8] --out OUT.json

For each ranker setup (pooled_cached: pooling on, cache 64 MiB, the saturation curve's setup; plain: pooling off, no
cache) it starts 2 embedding servers and the ranker (python -m tf_fusedrec.serve.bench's processes and synthetic
requests), warms it up, then for each repeat, each rate and each --prebuild value in turn (alternating, so drift in the
machine's load hits both alike) runs one open-loop test of --duration s, 64 instances a request, and records achieved
requests/s, p50/p99 and the CPU seconds per second of the ranker, the servers and this process (the load generator).
--ranker-variant (repeatable) starts one ranker per variant with FLAGS added (e.g. wait0="--batch-wait-ms 0"), all
on the same servers, and alternates between them run by run as well. --server-variant (repeatable) starts 2 embedding
servers per variant with FLAGS added (e.g. threads2="--threads 2") and the rankers once per variant on
its servers; every (server variant, ranker variant) pair alternates run by run. --transports (default plain) runs all
of that once per transport, each on its own servers and rankers, alternating run by run too: plain (HTTP, gRPC without
TLS), tls (every hop over TLS: the servers' gRPC, the ranker's HTTPS, verified against a throwaway CA made in
--work-dir, python -m tf_fusedrec.serve.bench --tls), mtls (mutual TLS on every hop).
EXPORT: an export of configs/criteo_serve.yaml (the bench trains one with --work-dir; or run
`python -c "from tf_fusedrec.serve import bench; bench.train_and_export('configs/criteo_serve.yaml', DIR, 30, 512, 600)"`).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from serve_servers import start_embedding_servers  # noqa: E402
from tf_fusedrec.serve import bench, loadtest  # noqa: E402

SETUPS = {"pooled_cached": bench.RankerSetup(True, 64.0), "plain": bench.RankerSetup(False, 0.0)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--export", required=True)
    p.add_argument("--config", default="configs/criteo_serve.yaml")
    p.add_argument("--setups", default="pooled_cached,plain")
    p.add_argument("--qps", default="120,200")
    p.add_argument("--prebuild", default="0,auto")
    p.add_argument("--ranker-variant", action="append", default=[], metavar='NAME="FLAGS"',
                   help="a ranker with FLAGS added (repeatable; default: one ranker, no flags added)")
    p.add_argument("--server-variant", action="append", default=[], metavar='NAME="FLAGS"',
                   help="2 embedding servers with FLAGS added (repeatable; default: one pair, no flags added)")
    p.add_argument("--transports", default="plain", help="comma-separated: plain, tls, mtls (default plain)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--work-dir", default="/tmp/bench_serve_ab")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    spec = bench.synthetic_spec(cfg.load_config(args.config), fmt.read_manifest(args.export))
    rates = [float(q) for q in args.qps.split(",")]
    variants = [v if v == "auto" else int(v) for v in args.prebuild.split(",")]

    def named_variants(option, given):
        if not given:
            return {"default": []}
        named = {}
        for v in given:
            name, sep, flags = v.partition("=")
            if not sep or not name:
                p.error(f"{option} {v!r}: expected NAME=\"FLAGS\"")
            named[name] = flags.split()
        return named

    ranker_variants = named_variants("--ranker-variant", args.ranker_variant)
    server_variants = named_variants("--server-variant", args.server_variant)
    kinds = {"plain": (False, False), "tls": (True, False), "mtls": (True, True)}
    unknown = [t for t in args.transports.split(",") if t not in kinds]
    if unknown:
        p.error(f"--transports {unknown[0]!r}: expected one of {', '.join(kinds)}")
    transports = {t: bench.Transport.make(*kinds[t], os.path.join(args.work_dir, t))
                  for t in args.transports.split(",")}
    result = {"command": "python benchmarks/serving/bench_serve_ab.py " + " ".join(sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "load_average_start": list(os.getloadavg())}, "runs": []}
    services = []
    try:
        server_sets = {}  # (transport, server variant) -> (addresses, [its Services])
        for tr, transport in transports.items():
            for sv, flags in server_variants.items():
                started = len(services)
                addresses = start_embedding_servers(args.export, args.work_dir, services,
                                                    flags=[*flags, *transport.server_flags()], name=f"server_{tr}_{sv}")
                server_sets[tr, sv] = (addresses, services[started:])
        for name in args.setups.split(","):
            setup = SETUPS[name]
            rankers = {}
            try:
                for (tr, sv), (addresses, _) in server_sets.items():
                    transport = transports[tr]
                    for rv, extra in ranker_variants.items():
                        port = bench.free_port()
                        service = bench.Service(
                            f"ranker {name} {tr} {sv} {rv}", "tf_fusedrec.serve.ranker",
                            ["--export", args.export, "--servers", addresses, "--port", str(port), "--name", "bench",
                             "--timeout-s", str(args.timeout), *setup.flags(), *extra, *transport.ranker_flags()],
                            os.path.join(args.work_dir, f"ranker_{name}_{tr}_{sv}_{rv}.log"))
                        rankers[tr, sv, rv] = (service, transport.url(port, "bench"), transport.client_tls())
                        service.start(120)
                warm = {f"{tr} {sv} {rv}": loadtest.LoadTest(url, loadtest.SyntheticInstances(spec, seed=999),
                                                             loadtest.ClosedLoop(1), args.batch, 2.0, args.timeout,
                                                             tls=tls).run()["ok"]
                        for (tr, sv, rv), (_, url, tls) in rankers.items()}
                seed = 0
                for repeat in range(args.repeats):
                    for qps in rates:
                        seed += 1
                        for variant in variants:
                            for (tr, sv, rv), (ranker, url, tls) in rankers.items():
                                pids = {"ranker": [ranker.proc.pid],
                                        "servers": [s.proc.pid for s in server_sets[tr, sv][1]]}
                                bench.settle(url, args.timeout, tls)
                                # The same arrivals and requests for every variant of a (repeat, rate).
                                test = loadtest.LoadTest(url, loadtest.SyntheticInstances(spec, seed=seed),
                                                         loadtest.OpenLoop(qps, max_in_flight=64, seed=seed),
                                                         args.batch, args.duration, args.timeout, prebuild=variant,
                                                         tls=tls)
                                test.prepare()
                                before, began = bench._cpu_seconds(pids), time.monotonic()  # noqa: SLF001
                                report = test.run()
                                after, elapsed = bench._cpu_seconds(pids), time.monotonic() - began  # noqa: SLF001
                                run = {"setup": name, "transport": tr, "server_variant": sv,
                                       "server_flags": server_variants[sv],
                                       "ranker_variant": rv, "ranker_flags": ranker_variants[rv],
                                       "repeat": repeat, "offered_qps": qps, "prebuild": variant,
                                       "requests_per_s": report["requests_per_s"], "ok": report["ok"],
                                       "arrivals": report["arrivals"], "dropped": report["dropped"],
                                       "errors": report["error_count"], "p50_ms": report["latency_ms"]["p50"],
                                       "p99_ms": report["latency_ms"]["p99"],
                                       "cpu_s_per_s": {k: (after[k] - before[k]) / elapsed for k in before},
                                       "bodies": report["bodies"], "load_average_after": list(os.getloadavg())}
                                result["runs"].append(run)
                                print(f"{name} {tr} {sv} {rv} r{repeat} {qps:g} q/s prebuild {variant}: "
                                      f"{run['requests_per_s']:.1f} req/s, p50 {run['p50_ms']} ms, "
                                      f"p99 {run['p99_ms']} ms, dropped {run['dropped']}, cpu "
                                      + " ".join(f"{k} {v:.2f}" for k, v in run["cpu_s_per_s"].items()), flush=True)
                result.setdefault("warm_up_ok", {})[name] = warm
            finally:
                for ranker, _, _ in rankers.values():
                    ranker.stop()
    finally:
        for s in services:
            s.stop()
    result["machine"]["load_average_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

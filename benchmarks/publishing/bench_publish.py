"""Fresh serving on loopback: how fresh the served model is, what a delta costs, and what publishing costs training.

    .venv/bin/python benchmarks/publishing/bench_publish.py --out benchmarks/results/publish [--config configs/criteo_synthetic.yaml]
        [--steps 200] [--every 50] [--repeats 2] [--workers 2] [--qps 20] [--transports plain,tls-token]
        [--modes publish,no_publish]

1. An export of the config's model after one training step (serve.bench.train_and_export), the start of serving.
2. Per transport of --transports (default plain): two embedding servers (even ranges, --accept-publish) and a ranker
   (--publish-port), started once.
3. --repeats rounds of two training runs each (--workers workers under horovodrun, --steps steps), alternating: one
   with --publish-to the ranker every --every steps, one without. During both, this process sends the ranker a predict
   request of 8 instances --qps times a second and records each answer's model_version, so both runs train beside the
   same serving load and differ only in publishing. With several transports, each round runs these per transport, in
   the order given, each against its own servers and ranker; --modes publish leaves out the runs without publishing
   (for freshness only).
4. Per published version: rows staged against the rows the version holds (the model's rows at its step: what a full
   version or an export at that step holds), bytes staged, the seconds the publish took in the trainer, and the
   freshness: from the start of the publish (the trainer's "published version" line, read as it is printed, less the
   publish's seconds) to the first predict answer carrying the version. Per run: samples/s (the summary's).
5. OUT/publish_bench.json (every run, the command, the load average) and OUT/publish_bench.md (tables), printed too.

Transports: plain (plain text on loopback, publishing unauthenticated, as before) and tls-token (issue 58's
authenticated publishing over TLS on every hop: certificates of a throwaway CA made in the work directory,
security.make_throwaway_pki through serve.bench.Transport; the embedding servers serve gRPC over TLS and take
publishes only with the token of a --publish-token-file made in the work directory; the ranker verifies them against
the CA, serves HTTPS on both ports and takes the token too; the trainer publishes with --tls-ca and the token file;
this process polls the ranker over HTTPS, verifying it).

On a 2-core machine the workers, the servers, the ranker and this process share the cores; the figures are those of
that machine, not of a cluster.
"""

import argparse
import json
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tf_fusedrec.serve import bench as serve_bench  # noqa: E402

log = serve_bench.log


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(ROOT / "configs" / "criteo_synthetic.yaml"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--qps", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a training run may take")
    p.add_argument("--transports", default="plain",
                   help=f"comma-separated, alternated run by run: {', '.join(TRANSPORTS)} (default plain)")
    p.add_argument("--modes", default="publish,no_publish",
                   help="comma-separated: publish, no_publish (default both: the runs alternate)")
    args = p.parse_args(argv)
    for flag, value, known in (("--transports", args.transports, TRANSPORTS), ("--modes", args.modes, MODES)):
        unknown = [v for v in value.split(",") if v not in known]
        if unknown or not value:
            p.error(f"{flag} {unknown[0] if unknown else value!r}: expected one of {', '.join(known)}")
    return args


# --transports: the serve bench's Transport (TLS or not) and whether publishing takes a token.
TRANSPORTS = {"plain": (False, False), "tls-token": (True, True)}
MODES = ("publish", "no_publish")


class Stack:
    """Two embedding servers and a ranker of one transport, started at once (their Services added to `services`, which
    the caller stops)."""

    def __init__(self, name, export, work, services):
        tls, token = TRANSPORTS[name]
        transport = serve_bench.Transport.make(tls, False, os.path.join(work, name))
        auth = []
        if token:
            token_file = os.path.join(work, name, "publish.token")
            with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            auth = ["--publish-token-file", token_file]
        ports = [serve_bench.free_port() for _ in range(4)]
        servers = [f"127.0.0.1:{p}" for p in ports[:2]]
        for i, port in enumerate(ports[:2]):
            services.append(serve_bench.Service(f"server{i}_{name}", "tf_fusedrec.serve.embedding_server", [
                "--export", export, "--shard", str(i), "--num-shards", "2", "--port", str(port), "--accept-publish",
                *transport.server_flags(), *auth], os.path.join(work, f"server{i}_{name}.log")).start(120))
        services.append(serve_bench.Service(f"ranker_{name}", "tf_fusedrec.serve.ranker", [
            "--export", export, "--servers", ",".join(servers), "--port", str(ports[2]), "--publish-port",
            str(ports[3]), *transport.ranker_flags(), *auth], os.path.join(work, f"ranker_{name}.log")).start(180))
        self.url = transport.url(ports[2], "model")
        self.publish_to = f"127.0.0.1:{ports[3]}"
        client = transport.client_tls()
        self.ssl_context = client.client_context() if client is not None else None
        # The trainer verifies the ranker and the servers against the CA and sends the token.
        self.trainer_flags = (["--tls-ca", transport.pki["ca"]] if tls else []) + auth


class Poller:
    """Sends a predict request qps times a second from a thread; records (time, model_version) of each answer."""

    def __init__(self, url, body, qps, ssl_context=None):
        self.url, self.body, self.period, self.ssl_context = url, body, 1.0 / qps, ssl_context
        self.answers, self.errors = [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="poller")

    def start(self):
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            began = time.time()
            request = urllib.request.Request(f"{self.url}:predict", data=self.body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10, context=self.ssl_context) as r:
                    answer = json.loads(r.read())
                self.answers.append((time.time(), int(answer["model_version"])))
            except Exception:  # noqa: BLE001  (counted; the bench goes on)
                self.errors += 1
            self._stop.wait(max(0.0, self.period - (time.time() - began)))

    def stop(self):
        self._stop.set()
        self._thread.join(15)

    def first_seen(self, version, after):
        times = [t for t, v in self.answers if v >= version and t >= after]
        return min(times) if times else None


def train(args, work, name, publish_to, publish_flags=(), extra=(), lines=None):
    """One training run -> (summary, [(time the line was read, line)] of its output). `extra`: more flags of the train
    app; `lines`: the list the lines go into as they are read (for a caller watching the run from another thread)."""
    summary = os.path.join(work, f"{name}.json")
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", str(args.workers), "-H", f"localhost:{args.workers}", "--gloo", sys.executable,
           "-m", "tf_fusedrec.train", "--config", args.config, "--steps", str(args.steps), "--no-progress",
           "--summary-json", summary]
    if publish_to:
        cmd += ["--publish-to", publish_to, "--publish-every", str(args.every), *publish_flags]
    cmd += [str(x) for x in extra]
    log(f"{name}: {shlex.join(cmd[cmd.index('-m'):])}")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=serve_bench.child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = [] if lines is None else lines
    timer = threading.Timer(args.timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
        code = proc.wait()
    finally:
        timer.cancel()
        serve_bench._end_group(proc)  # noqa: SLF001
    if code != 0:
        raise RuntimeError(f"{name}: exit status {code}\n" + "\n".join(line for _, line in lines[-40:]))
    with open(summary) as f:
        return json.load(f), lines


def versions_of(lines):
    """{version: time its publish started} from the trainer's 'published version V (step S, ..., X.XX s)' lines."""
    out = {}
    for t, line in lines:
        marker = line.find("published version ")
        if marker < 0:
            continue
        words = line[marker:].split()
        version = int(words[2])
        seconds = float(line.rsplit(",", 1)[1].strip().rstrip(")").split()[0])
        out[version] = t - seconds
    return out


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench_publish-")
    services = []
    try:
        export = serve_bench.train_and_export(args.config, work, 1, 64, args.timeout)
        transports = args.transports.split(",")
        stacks = {t: Stack(t, export, work, services) for t in transports}
        body = json.dumps({"instances": [{"dense": [0.5] * 13, **{f"C{i}": (i * 7 + j) % 1000 for i in range(1, 24)},
                                          **{f"C{i}": [j, j + 1] for i in range(24, 27)}}
                                         for j in range(8)]}).encode()
        runs = []
        modes = [m for m in MODES if m in args.modes.split(",")]
        for repeat, transport, mode in ((r, t, m) for r in range(args.repeats) for t in transports for m in modes):
            stack = stacks[transport]
            poller = Poller(stack.url, body, args.qps, stack.ssl_context).start()
            try:
                name = f"{mode}-{repeat}" if transports == ["plain"] else f"{transport}-{mode}-{repeat}"
                summary, lines = train(args, work, name, stack.publish_to if mode == "publish" else None,
                                       stack.trainer_flags)
            finally:
                poller.stop()
            # Publishing runs between steps, in the training loop: the summary's samples/s times the steps
            # only, so the publishes' seconds are added back (per sample) for the run's effective rate.
            samples = summary["batch_size_per_worker"] * summary["workers"] * summary["steps"]
            publish_s = sum(summary["published"]["seconds"]) if mode == "publish" else 0.0
            run = {"mode": mode, "transport": transport, "repeat": repeat,
                   "step_samples_per_s": summary["samples_per_s"],
                   "publish_seconds": publish_s,
                   "samples_per_s": 1.0 / (1.0 / summary["samples_per_s"] + publish_s / samples),
                   "poll_answers": len(poller.answers), "poll_errors": poller.errors, "loadavg": os.getloadavg()}
            if mode == "publish":
                published, started = summary["published"], versions_of(lines)
                run["published"] = published
                run["versions"] = []
                for i, (version, step, full) in enumerate(published["versions"]):
                    seen = poller.first_seen(version, started.get(version, 0))
                    run["versions"].append({
                        "version": version, "step": step, "full": full,
                        "rows_staged": published["rows_per_publish"][i],
                        "rows_held": published["rows_held_per_publish"][i],
                        "bytes_staged": published["bytes_per_publish"][i],
                        "freshness_s": None if seen is None or version not in started else seen - started[version]})
            runs.append(run)
            log(f"{name}: {run['samples_per_s']:.0f} samples/s")
        report = {"command": shlex.join([sys.executable, *sys.argv]), "args": vars(args), "runs": runs,
                  "loadavg": os.getloadavg(), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        (out / "publish_bench.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "publish_bench.md").write_text(render(report))
        print(render(report))
    finally:
        for service in reversed(services):
            service.stop()


def render(report):
    runs = report["runs"]

    def label(run):
        transport = run.get("transport", "plain")
        return f"{run['mode']} {run['repeat']}" if transport == "plain" else f"{transport} {run['mode']} {run['repeat']}"

    lines = [f"# {report['command']}", "",
             "| run | samples/s of the steps | seconds publishing | samples/s with publishing | "
             "vs the run without publishing after it |", "|---|---:|---:|---:|---:|"]
    for i, run in enumerate(runs):
        other = runs[i + 1] if run["mode"] == "publish" and i + 1 < len(runs) else None
        if other is not None and (other["mode"] != "no_publish" or other.get("transport") != run.get("transport")):
            other = None
        ratio = f"{run['samples_per_s'] / other['samples_per_s']:.2f}x" if other else ""
        lines.append(f"| {label(run)} | {run['step_samples_per_s']:.0f} | "
                     f"{run['publish_seconds']:.2f} | {run['samples_per_s']:.0f} | {ratio} |")
    lines += ["", "| run | version | step | kind | rows staged | rows held | staged / held | bytes staged | "
              "freshness s |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    freshness = {}  # transport -> the deltas' freshness
    for run in runs:
        for v in run.get("versions", []):
            f = v["freshness_s"]
            if f is not None and not v["full"]:
                freshness.setdefault(run.get("transport", "plain"), []).append(f)
            kind = "full" if v["full"] else "delta"
            share = v["rows_staged"] / max(v["rows_held"], 1)
            lines.append(f"| {label(run)} | {v['version']} | {v['step']} | {kind} | {v['rows_staged']} | "
                         f"{v['rows_held']} | {share:.0%} | {v['bytes_staged']} | {'' if f is None else f'{f:.2f}'} |")
    for transport, values in freshness.items():
        lines += ["", f"deltas' freshness{'' if len(freshness) == 1 else f' ({transport})'}: "
                      f"p50 {np.percentile(values, 50):.2f} s, p99 {np.percentile(values, 99):.2f} s, "
                      f"max {max(values):.2f} s ({len(values)} versions)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

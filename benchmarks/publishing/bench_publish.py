"""Fresh serving on loopback: how fresh the served model is, what a delta costs, and what publishing costs training.

    .venv/bin/python benchmarks/publishing/bench_publish.py --out benchmarks/results/publish [--config configs/criteo_synthetic.yaml]
        [--steps 200] [--every 50] [--repeats 2] [--workers 2] [--qps 20]

1. An export of the config's model after one training step (serve.bench.train_and_export), the start of serving.
2. Two embedding servers (even ranges, --accept-publish) and a ranker (--publish-port), started once.
3. --repeats rounds of two training runs each (--workers workers under horovodrun, --steps steps), alternating: one
   with --publish-to the ranker every --every steps, one without. During both, this process sends the ranker a predict
   request of 8 instances --qps times a second and records each answer's model_version, so both runs train beside the
   same serving load and differ only in publishing.
4. Per published version: rows staged against the rows the version holds (the model's rows at its step: what a full
   version or an export at that step holds), bytes staged, the seconds the publish took in the trainer, and the
   freshness: from the start of the publish (the trainer's "published version" line, read as it is printed, less the
   publish's seconds) to the first predict answer carrying the version. Per run: samples/s (the summary's).
5. OUT/publish_bench.json (every run, the command, the load average) and OUT/publish_bench.md (tables), printed too.

On a 2-core machine the workers, the servers, the ranker and this process share the cores; the figures are those of
that machine, not of a cluster.
"""

import argparse
import json
import os
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
    return p.parse_args(argv)


class Poller:
    """Sends a predict request qps times a second from a thread; records (time, model_version) of each answer."""

    def __init__(self, url, body, qps):
        self.url, self.body, self.period = url, body, 1.0 / qps
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
                with urllib.request.urlopen(request, timeout=10) as r:
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


def train(args, work, name, publish_to):
    """One training run -> (summary, [(time the line was read, line)] of its output)."""
    summary = os.path.join(work, f"{name}.json")
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", str(args.workers), "-H", f"localhost:{args.workers}", "--gloo", sys.executable,
           "-m", "tf_fusedrec.train", "--config", args.config, "--steps", str(args.steps), "--no-progress",
           "--summary-json", summary]
    if publish_to:
        cmd += ["--publish-to", publish_to, "--publish-every", str(args.every)]
    log(f"{name}: {shlex.join(cmd[cmd.index('-m'):])}")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=serve_bench.child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
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
        ports = [serve_bench.free_port() for _ in range(4)]
        servers = [f"127.0.0.1:{p}" for p in ports[:2]]
        for i, port in enumerate(ports[:2]):
            services.append(serve_bench.Service(f"server{i}", "tf_fusedrec.serve.embedding_server", [
                "--export", export, "--shard", str(i), "--num-shards", "2", "--port", str(port), "--accept-publish"],
                os.path.join(work, f"server{i}.log")).start(120))
        services.append(serve_bench.Service("ranker", "tf_fusedrec.serve.ranker", [
            "--export", export, "--servers", ",".join(servers), "--port", str(ports[2]), "--publish-port",
            str(ports[3])], os.path.join(work, "ranker.log")).start(180))
        url = f"http://127.0.0.1:{ports[2]}/v1/models/model"
        body = json.dumps({"instances": [{"dense": [0.5] * 13, **{f"C{i}": (i * 7 + j) % 1000 for i in range(1, 24)},
                                          **{f"C{i}": [j, j + 1] for i in range(24, 27)}}
                                         for j in range(8)]}).encode()
        runs = []
        for repeat in range(args.repeats):
            for mode in ("publish", "no_publish"):
                poller = Poller(url, body, args.qps).start()
                try:
                    summary, lines = train(args, work, f"{mode}-{repeat}",
                                           f"127.0.0.1:{ports[3]}" if mode == "publish" else None)
                finally:
                    poller.stop()
                # Publishing runs between steps, in the training loop: the summary's samples/s times the steps
                # only, so the publishes' seconds are added back (per sample) for the run's effective rate.
                samples = summary["batch_size_per_worker"] * summary["workers"] * summary["steps"]
                publish_s = sum(summary["published"]["seconds"]) if mode == "publish" else 0.0
                run = {"mode": mode, "repeat": repeat, "step_samples_per_s": summary["samples_per_s"],
                       "publish_seconds": publish_s,
                       "samples_per_s": 1.0 / (1.0 / summary["samples_per_s"] + publish_s / samples),
                       "poll_answers": len(poller.answers), "poll_errors": poller.errors}
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
                log(f"{mode} {repeat}: {run['samples_per_s']:.0f} samples/s")
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
    lines = [f"# {report['command']}", "",
             "| run | samples/s of the steps | seconds publishing | samples/s with publishing | "
             "vs the run without publishing after it |", "|---|---:|---:|---:|---:|"]
    for i, run in enumerate(runs):
        other = runs[i + 1] if run["mode"] == "publish" and i + 1 < len(runs) else None
        ratio = f"{run['samples_per_s'] / other['samples_per_s']:.2f}x" if other else ""
        lines.append(f"| {run['mode']} {run['repeat']} | {run['step_samples_per_s']:.0f} | "
                     f"{run['publish_seconds']:.2f} | {run['samples_per_s']:.0f} | {ratio} |")
    lines += ["", "| run | version | step | kind | rows staged | rows held | staged / held | bytes staged | "
              "freshness s |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    freshness = []
    for run in runs:
        for v in run.get("versions", []):
            f = v["freshness_s"]
            if f is not None and not v["full"]:
                freshness.append(f)
            kind = "full" if v["full"] else "delta"
            share = v["rows_staged"] / max(v["rows_held"], 1)
            lines.append(f"| publish {run['repeat']} | {v['version']} | {v['step']} | {kind} | {v['rows_staged']} | "
                         f"{v['rows_held']} | {share:.0%} | {v['bytes_staged']} | {'' if f is None else f'{f:.2f}'} |")
    if freshness:
        lines += ["", f"deltas' freshness: p50 {np.percentile(freshness, 50):.2f} s, max {max(freshness):.2f} s "
                      f"({len(freshness)} versions)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

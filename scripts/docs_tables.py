"""Renders the result tables of the README and the docs pages from the committed result files under
benchmarks/results/, and copies the plots the pages show from there into docs/assets/ (`make docs-tables`).

    .venv/bin/python scripts/docs_tables.py            # rewrites the generated tables in place, in every page,
                                                       # and the plots' copies
    .venv/bin/python scripts/docs_tables.py --check    # exits 1 naming each table (or plot copy) that differs
    .venv/bin/python scripts/docs_tables.py FILE...    # only the tables marked in these files

A generated table sits between two markers in a Markdown page (README.md, or a page of the docs site under docs/),
the first naming the table and the files it is read from:

    <!-- table:bench-modes from benchmarks/results/bench.json -->
    | mode | samples/s | ...
    <!-- /table -->

Each table is marked in exactly one page. Everything between the markers is rewritten: a blank line, the table
(indented like the opening marker, so a table may sit in a list item), a blank line. The opening marker is rewritten
too, so the files it names are always the ones read. Figures keep the rounding of the command that wrote the file
(tf_fusedrec/bench, tf_fusedrec/serve/bench.py, tf_fusedrec/cluster/model.py, benchmarks/grm/bench_grm_*.sh). Only the
standard library: the pages can be checked without TensorFlow (tests/test_docs_tables.py).
"""

import argparse
import filecmp
import glob
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The Markdown pages that may hold generated tables: the README and every page under docs/.
PAGES = ("README.md", "docs/**/*.md")
# The plots the pages show: the site is built from docs/ alone, so each is copied from benchmarks/results/ to the same
# path under docs/assets/, where the pages show it from.
RESULTS, ASSETS = "benchmarks/results", "docs/assets"
PLOTS = ("bench.png", "cluster/model.png", "hot/hot_sweep.png", "serve/serve_curve.png", "serve/plain/serve_curve.png",
         "serve/plain_1127/serve_curve.png", "serve/async_1127/serve_curve.png", "publish/online_loop.png")
BEGIN = re.compile(r"^(?P<indent>[ \t]*)<!-- table:(?P<name>[a-z0-9-]+)(?: from (?P<sources>[^>]*?))? -->[ \t]*$")
END = re.compile(r"^[ \t]*<!-- /table -->[ \t]*$")


# --- reading ---------------------------------------------------------------------------------------------------------


def _path(name):
    return os.path.join(ROOT, name)


def _json(name):
    with open(_path(name)) as f:
        return json.load(f)


def _run_dirs(pattern):
    """Sorted run directories (relative to the root) matched by `pattern`/bench.json or probe.json."""
    return sorted(os.path.relpath(os.path.dirname(p), ROOT) for p in glob.glob(_path(pattern)))


def _rates():
    """Network name -> link bytes/s (None for loopback), as the cost model recorded them."""
    return {k: v["rate_bytes_per_s"] for k, v in _json("benchmarks/results/cluster/model.json")["networks"].items()}


def _by_rate(networks):
    """Networks in the order a reader compares them: loopback first, then by link rate."""
    rates = _rates()
    return sorted(networks, key=lambda n: (rates[n] is not None, rates[n] or 0))


def _table(header, aligns, rows):
    """A Markdown table: `aligns` is one of "l" or "r" per column."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in aligns) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the tables ------------------------------------------------------------------------------------------------------


def grm_storage():
    """benchmarks/grm/bench_grm_storage.sh's table: per mode, rows, bytes and AUC against float32, for each data seed."""
    d = _json("benchmarks/results/grm/storage_bench.json")
    seeds = sorted({r["seed"] for r in d["runs"]})
    seed_list = ", ".join(map(str, seeds))

    def label(mode):
        runs = [r for r in d["runs"] if r["mode"] == mode]
        if mode == "mixed":
            hot = "; ".join(f"{', '.join(map(str, r['hot_rows']))} (seed {r['seed']})" for r in runs)
            return f"float16 + `--hot 2000` rows per group in float32 (R = {hot} after the byte cap)"
        if mode == "evict":
            e = runs[0]["eviction"]
            return (f"float32, `--evict-capacity {e['capacity']} --evict-interval {e['interval']}` "
                    f"({e['policy'].upper()})")
        return mode

    def delta(x):
        return "0" if x == 0 else f"{x:+.4f}"

    rows = []
    for mode, s in d["summary"].items():
        rows.append([label(mode), ", ".join(f"{n:,}" for n in s["rows_at_end"]), f"{s['row_bytes_vs_float32']:.2f}",
                     f"{s['all_bytes_vs_float32']:.2f}",
                     ", ".join(delta(x) for x in s["auc_minus_float32"]["click"]),
                     ", ".join(delta(x) for x in s["auc_minus_float32"]["conversion"])])
    return _table(["mode", f"rows at the end (2 workers; seed {seed_list})", "row bytes vs float32",
                   "rows + slots vs float32", f"AUC click - float32 (seed {seed_list})",
                   f"AUC conversion - float32 (seed {seed_list})"], "lrrrll", rows)


def grm_storage_seeds():
    """float16 against float32 over more data seeds (benchmarks/results/grm/storage_bench_float16_seeds.json)."""
    d = _json("benchmarks/results/grm/storage_bench_float16_seeds.json")
    base = {r["seed"]: r for r in d["runs"] if r["mode"] == "float32"}
    rows = []
    for task in ("click", "conversion"):
        deltas = [r["auc"][task] - base[r["seed"]]["auc"][task] for r in d["runs"] if r["mode"] == "float16"]
        rows.append([task, ", ".join(f"{base[s]['auc'][task]:.4f}" for s in sorted(base)),
                     ", ".join(f"{x:+.4f}" for x in deltas), f"{sum(deltas) / len(deltas):+.4f}",
                     f"{sum(abs(x) <= 0.002 for x in deltas)} of {len(deltas)}"])
    seeds = ", ".join(map(str, sorted(base)))
    return _table(["task", f"float32 AUC (seed {seeds})", f"float16 - float32 (seed {seeds})", "mean",
                   "within 0.002"], "llllr", rows)


def grm_storage_stochastic(path="benchmarks/results/grm/stochastic/storage_bench_float16_stochastic_seeds.json"):
    """float16 rounded to nearest and stochastically (float16s) against float32 per data seed, and the controls
    float32tfra (float32 on the TFRA backend) and float32dnnoff (float32 with oneDNN off: other last bits in the dense
    model), "-" where a mode has no run of the seed (`path`: benchmarks/grm/bench_grm_storage.sh's summary)."""
    d = _json(path)
    base = {r["seed"]: r for r in d["runs"] if r["mode"] == "float32"}
    labels = {"float16": "float16, nearest", "float16s": "float16, stochastic",
              "float32tfra": "control: float32, TFRA backend", "float32dnnoff": "control: float32, oneDNN off"}
    rows = []
    for task in ("click", "conversion"):
        rows.append([task, "float32 AUC", ", ".join(f"{base[s]['auc'][task]:.4f}" for s in sorted(base)), "", "", ""])
        for mode, label in labels.items():
            delta = {r["seed"]: r["auc"][task] - base[r["seed"]]["auc"][task] for r in d["runs"] if r["mode"] == mode}
            if not delta:
                continue
            deltas = list(delta.values())
            rows.append([task, f"{label} - float32", ", ".join(f"{delta[s]:+.4f}" if s in delta else "-"
                                                               for s in sorted(base)),
                         f"{sum(deltas) / len(deltas):+.4f}", f"{min(deltas):+.4f}",
                         f"{sum(x >= -0.003 for x in deltas)} of {len(deltas)}"])
    seeds = ", ".join(map(str, sorted(base)))
    return _table(["task", "what", f"seed {seeds}", "mean", "worst", "loss <= 0.003"], "llllrr", rows)


def bench_modes():
    """`python -m tf_fusedrec.bench`'s mode table (benchmarks/results/bench.json), the columns this run recorded."""
    d = _json("benchmarks/results/bench.json")
    modes = d["modes"]
    base, fused = modes["per_feature"]["samples_per_s"], modes["fused"]["samples_per_s"]
    rows = [[m, f"{r['samples_per_s']:,.0f}", f"{r['samples_per_s'] / base:.2f}x", f"{r['samples_per_s'] / fused:.2f}x",
             f"{r['alltoall_calls_per_step']:.0f}", f"{r['alltoall_mean_message_bytes']:,.0f}",
             f"{r['step_seconds']:.4f}", f"{r['alltoall_busy_seconds_per_step']:.4f}",
             f"{r['exposed_alltoall_seconds_per_step']:.4f}", f"{r['forward_alltoall_seconds_per_step']:.4f}"]
            for m, r in modes.items()]
    return _table(["mode", "samples/s (all workers)", "vs per_feature", "vs fused", "all-to-alls / step",
                   "mean bytes / all-to-all", "step s", "all-to-all in flight s / step",
                   "exposed all-to-all s / step", "forward all-to-all calls' durations, summed, s / step"],
                  "lrrrrrrrrr", rows)


def bench_sweep():
    """The same run's sweep over the number of features M."""
    sweep = _json("benchmarks/results/bench.json")["sweep"]
    modes = list(next(iter(sweep.values())))
    rows = [[m] + [f"{r[x]['samples_per_s']:,.0f}" for x in modes]
            + [f"{r['fused']['samples_per_s'] / r['per_feature']['samples_per_s']:.2f}x"]
            for m, r in sorted(sweep.items(), key=lambda kv: int(kv[0]))]
    return _table(["features M"] + [f"{m} samples/s" for m in modes] + ["fused vs per_feature"],
                  "r" * (len(modes) + 2), rows)


def pipeline_cpu():
    """The pipelines' CPU profile run (benchmarks/results/pipeline/cpu_profile.json): step and rank 0's CPU seconds per step."""
    modes = _json("benchmarks/results/pipeline/cpu_profile.json")["modes"]
    rows = [[m, f"{r['samples_per_s']:,.0f}", f"{r['step_seconds']:.3f}", f"{r['cpu_seconds_per_step']:.3f}",
             f"{r['cpu_seconds_per_step'] / r['step_seconds']:.0%}"] for m, r in modes.items()]
    return _table(["mode", "samples/s (all workers)", "step s", "CPU s / step (rank 0)", "CPU / step"], "lrrrr", rows)


def pipeline_clustering():
    """`python -m tf_fusedrec.bench.clustering`'s table (benchmarks/results/pipeline/clustering.json), with clustered / naive."""
    d = _json("benchmarks/results/pipeline/clustering.json")
    rows = [[k, f"{r['whole']:,.0f}", f"{r['naive']:,.0f}", f"{r['naive'] / r['whole']:.2f}x", f"{r['clustered']:,.0f}",
             f"{r['clustered'] / r['whole']:.2f}x", f"{r['clustered'] / r['naive'] - 1:+.2%}"]
            for k, r in sorted(d["micro_batches"].items(), key=lambda kv: int(kv[0]))]
    return _table(["k", "whole batch", "naive split", "naive / whole", "clustered", "clustered / whole",
                   "clustered vs naive"], "rrrrrrr", rows)


TABLE_ROWS = (("floor", "plain C++ loop over the native table's hash map (the floor: one fused probe, no TensorFlow)"),
              ("native", "native (`lookup_or_init` then `apply_sparse`, in a `tf.function`)"),
              ("tfra", "TFRA (2 lookups + 2 upserts, as `fr.train` did)"))


def table_keys():
    """`python -m tf_fusedrec.bench.table`: keys/s of one thread per table (the median run)."""
    d = _json("benchmarks/results/table/table.json")
    return _table(["table", "keys/s, one thread"], "lr",
                  [[label, f"{d[k]['keys_per_s'] / 1e6:.2f}M"] for k, label in TABLE_ROWS])


def _bench_mode_table(name, baseline, alltoalls=True):
    """A bench.json's modes: samples/s, the ratio to `baseline`'s, (all-to-alls per step,) step and CPU seconds."""
    d = _json(name)
    base = d["modes"][baseline]["samples_per_s"]
    rows = [[m, f"{r['samples_per_s']:,.0f}", f"{r['samples_per_s'] / base:.2f}x"]
            + ([f"{r['alltoall_calls_per_step']:.0f}"] if alltoalls else [])
            + [f"{r['step_seconds']:.4f}", f"{r['cpu_seconds_per_step']:.4f}"]
            for m, r in d["modes"].items()]
    header = (["mode", "samples/s (all workers)", f"vs {baseline}"] + (["all-to-alls / step"] if alltoalls else [])
              + ["step s", "CPU s / step (rank 0)"])
    return _table(header, "l" + "r" * (len(header) - 1), rows)


def bench_table_backend():
    return _bench_mode_table("benchmarks/results/bench/table_backend/bench.json", "per_feature")


def bench_step_cost_modes():
    """The modes on 2 pinned workers with the fused output sums and interaction op (fused_chain: the op chains)."""
    return _bench_mode_table("benchmarks/results/bench/step_cost_modes/bench.json", "per_feature")


def bench_step_cost_1worker():
    """1 worker: fused (and fused_chain) against dense_only, the same model fed constant embeddings."""
    return _bench_mode_table("benchmarks/results/bench/step_cost_1worker/bench.json", "dense_only", alltoalls=False)


def _placement_runs(pattern):
    """[(run number, placement, bench.json)] of benchmarks/training/bench_placement.sh's {pinned,unpinned}-N directories: by run
    number, pinned before unpinned; the placement as the run recorded it (rank 0's CPUs)."""
    runs = sorted(_run_dirs(pattern),
                  key=lambda p: (int(p.rsplit("-", 1)[1]), not os.path.basename(p).startswith("pinned")))
    out = []
    for path in runs:
        d = _json(os.path.join(path, "bench.json"))
        cpus = d["cpus_per_worker"]
        placement = f"{'pinned' if cpus == 1 else 'unpinned'} ({cpus} CPU{'s' if cpus > 1 else ''} per worker)"
        out.append((path.rsplit("-", 1)[1], placement, d))
    return out


def bench_pinning():
    """benchmarks/results/bench/pinning/{pinned,unpinned}-N: the run number, then pinned before unpinned."""
    rows = [[run, placement] + [f"{d['modes'][m]['samples_per_s']:,.0f}" for m in ("fused_tfra", "fused_native")]
            for run, placement, d in _placement_runs("benchmarks/results/bench/pinning/*/bench.json")]
    return _table(["run", "placement", "fused_tfra samples/s", "fused_native samples/s"], "llrr", rows)


def _value_runs(directory):
    """{run number: {value: the bench.json's "modes"}} of directory/VALUE-N/bench.json (benchmarks/training/bench_env.sh's and
    benchmarks/training/bench_transport.sh's run directories; VALUE may hold dashes, N is after the last)."""
    runs = {}
    for path in _run_dirs(f"{directory}/*/bench.json"):
        value, n = os.path.basename(path).rsplit("-", 1)
        runs.setdefault(int(n), {})[value] = _json(os.path.join(path, "bench.json"))["modes"]
    return runs


TRANSPORT_MODES = ("fused", "tfra_hand_fused", "per_feature")


def bench_transport(directory="benchmarks/results/bench/transport"):
    """directory/{gloo,mpi}-N (benchmarks/training/bench_transport.sh; benchmarks/results/bench/transport: MPI ranks spinning while they wait,
    benchmarks/results/bench/transport_yield: yielding, the library's default since): per run and transport, samples/s of each
    mode, fused's ratios to the two baselines of the same run, and the MPI run's fused against the Gloo run's."""
    runs = _value_runs(directory)
    rows = []
    for n in sorted(runs):
        for transport in ("gloo", "mpi"):
            if transport not in runs[n]:
                continue
            m = runs[n][transport]
            rate = {k: m[k]["samples_per_s"] for k in TRANSPORT_MODES}
            against_gloo = (f"{rate['fused'] / runs[n]['gloo']['fused']['samples_per_s']:.2f}x"
                            if transport == "mpi" and "gloo" in runs[n] else "1.00x" if transport == "gloo" else "-")
            rows.append([n, "Gloo (TCP loopback)" if transport == "gloo" else "MPI (Open MPI, shared memory)"]
                        + [f"{rate[k]:,.0f}" for k in TRANSPORT_MODES]
                        + [f"{rate['fused'] / rate['tfra_hand_fused']:.2f}x", f"{rate['fused'] / rate['per_feature']:.2f}x",
                           against_gloo])
    return _table(["run", "transport"] + [f"{k} samples/s" for k in TRANSPORT_MODES]
                  + ["fused vs tfra_hand_fused", "fused vs per_feature", "fused vs Gloo's fused"], "ll" + "r" * 6, rows)


def bench_cycle_time_mpi(directory, labels):
    """directory/VALUE-N (benchmarks/training/bench_env.sh VAR=HOROVOD_CYCLE_TIME over horovodrun --mpi, values alternating):
    per run and value (labels: value -> row label, in row order), samples/s of each mode the runs hold, fused's
    ratios to the other modes of the same run and value, and fused against the first label's fused of that run."""
    runs = _value_runs(directory)
    modes = [k for k in TRANSPORT_MODES if all(k in m for r in runs.values() for m in r.values())]
    first = next(iter(labels))
    rows = []
    for n in sorted(runs):
        for value, label in labels.items():
            if value not in runs[n]:
                continue
            rate = {k: runs[n][value][k]["samples_per_s"] for k in modes}
            base = runs[n].get(first)
            rows.append([n, label] + [f"{rate[k]:,.0f}" for k in modes]
                        + [f"{rate['fused'] / rate[k]:.2f}x" for k in modes if k != "fused"]
                        + [f"{rate['fused'] / base['fused']['samples_per_s']:.2f}x" if base else "-"])
    return _table(["run", "HOROVOD_CYCLE_TIME (ms)"] + [f"{k} samples/s" for k in modes]
                  + [f"fused vs {k}" for k in modes if k != "fused"] + [f"fused vs {labels[first]}'s"],
                  "ll" + "r" * (2 * len(modes)), rows)


def readme_headline(directory="benchmarks/results/bench/cycle_time_mpi_default"):
    """The README's headline: the runs of `directory` at the library's defaults (directory/default-N), each mode's
    samples/s and fused's ratio to the two baselines of the same run."""
    runs = _value_runs(directory)
    rows = []
    for n in sorted(runs):
        rate = {k: runs[n]["default"][k]["samples_per_s"] for k in TRANSPORT_MODES}
        rows.append([n] + [f"{rate[k]:,.0f}" for k in TRANSPORT_MODES]
                    + [f"{rate['fused'] / rate[k]:.2f}x" for k in TRANSPORT_MODES if k != "fused"])
    return _table(["run"] + [f"{k} samples/s" for k in TRANSPORT_MODES]
                  + [f"fused vs {k}" for k in TRANSPORT_MODES if k != "fused"], "l" + "r" * 5, rows)


def bench_mpi_yield():
    """benchmarks/results/bench/mpi_yield/{0,default}-N (benchmarks/training/bench_env.sh over horovodrun --mpi): spinning ranks
    (OMPI_MCA_mpi_yield_when_idle=0) against the library's default (unset: comm.init_workers sets 1), per run."""
    runs = _value_runs("benchmarks/results/bench/mpi_yield")
    rows = []
    for n in sorted(runs):
        for value in ("0", "default"):
            if value not in runs[n]:
                continue
            m = runs[n][value]
            rate = {k: m[k]["samples_per_s"] for k in TRANSPORT_MODES}
            spin = runs[n].get("0")
            rows.append([n, "0 (spin)" if value == "0" else "unset: 1, the library's default (yield)"]
                        + [f"{rate[k]:,.0f}" for k in TRANSPORT_MODES]
                        + [f"{1e3 * m['fused']['cpu_seconds_per_step']:.1f}",
                           f"{rate['fused'] / rate['tfra_hand_fused']:.2f}x", f"{rate['fused'] / rate['per_feature']:.2f}x",
                           f"{rate['fused'] / spin['fused']['samples_per_s']:.2f}x" if spin else "-"])
    return _table(["run", "OMPI_MCA_mpi_yield_when_idle"] + [f"{k} samples/s" for k in TRANSPORT_MODES]
                  + ["fused CPU ms / step (rank 0)", "fused vs tfra_hand_fused", "fused vs per_feature",
                     "fused vs the spinning run"], "ll" + "r" * 7, rows)


def _rate_cpu_cell(result, base=None):
    """A mode's cell: samples/s (with its ratio to `base`'s, the same mode's baseline run, when given) and rank 0's CPU
    per step."""
    ratio = f" ({result['samples_per_s'] / base['samples_per_s']:.2f}x)" if base is not None else ""
    return f"{result['samples_per_s']:,.0f}{ratio}, {1e3 * result['cpu_seconds_per_step']:.1f} ms"


def _fused_versus(modes_result, others):
    """fused's samples/s against each of `others` in the same run."""
    return [f"{modes_result['fused']['samples_per_s'] / modes_result[k]['samples_per_s']:.2f}x" for k in others]


def _value_ab(directory, values, header, label, modes, versus=True):
    """directory/VALUE-N (benchmarks/training/bench_env.sh's or a loop's run directories): per run and value (values[0] is the
    baseline), each mode's samples/s (other values with their ratio to the baseline of the same run) and rank 0's CPU
    per step, and (versus) fused against the other modes of the same run and value. `label(value)`: its cell."""
    runs = _value_runs(directory)
    others = [k for k in modes if k != "fused"] if versus else []
    rows = []
    for n in sorted(runs):
        base = runs[n].get(values[0])
        for value in values:
            if value not in runs[n]:
                continue
            m = runs[n][value]
            cells = [_rate_cpu_cell(m[k], base[k] if base and value != values[0] else None) for k in modes]
            rows.append([n, label(value)] + cells + _fused_versus(m, others))
    return _table(["run", header] + [f"{k} samples/s, CPU / step (rank 0)" for k in modes]
                  + [f"fused vs {k}" for k in others], "ll" + "r" * (len(modes) + len(others)), rows)


def bench_malloc():
    """benchmarks/results/bench/malloc/{default,libtcmalloc_minimal.so.4}-N (benchmarks/training/bench_env.sh over horovodrun --mpi, VAR=LD_PRELOAD):
    glibc's malloc against tcmalloc, per run: samples/s and CPU per step of each mode, and tcmalloc's ratio."""
    return _value_ab("benchmarks/results/bench/malloc", ("default", "libtcmalloc_minimal.so.4"), "malloc",
                     lambda v: "glibc (default)" if v == "default" else f"tcmalloc (`LD_PRELOAD={v}`)", TRANSPORT_MODES,
                     versus=False)


def bench_malloc_thresholds(directory, modes):
    """directory/{default,tuned}-N (benchmarks/training/bench_env.sh over horovodrun --mpi, VAR=TF_FUSEDREC_MALLOC at the commit
    that had tf_fusedrec/malloc.py): glibc's own malloc thresholds against fixed high ones."""
    return _value_ab(directory, ("default", "tuned"), "malloc thresholds",
                     lambda v: "glibc's own" if v == "default" else "mmap 32 MiB, trim 256 MiB", modes)


def bench_steps_per_call():
    """benchmarks/results/bench/steps_per_call/{1,4}-N (python -m tf_fusedrec.bench --steps-per-call K over horovodrun --mpi,
    alternating): fused and tfra_hand_fused at K = 1 and 4."""
    return _value_ab("benchmarks/results/bench/steps_per_call", ("1", "4"), "steps per call", str, ("fused", "tfra_hand_fused"))


PIPELINE_MODES = ("fused", "fused_dbp", "fused_fwp", "fused_hot", "fused_hot_dbp")


def bench_pipelines_native(directory="benchmarks/results/bench/pipelines_native"):
    """directory/{pinned,unpinned}-N (benchmarks/results/bench/pipelines_native: over Gloo; benchmarks/results/bench/pipelines_mpi: over Open MPI):
    samples/s of the schedules and of hot replication on native tables, each with its ratio to `fused` of the same
    run."""
    rows = []
    for run, placement, d in _placement_runs(f"{directory}/*/bench.json"):
        base = d["modes"]["fused"]["samples_per_s"]
        rows.append([run, placement] + [f"{d['modes'][m]['samples_per_s']:,.0f} "
                                        f"({d['modes'][m]['samples_per_s'] / base:.2f}x)" for m in PIPELINE_MODES])
    return _table(["run", "placement"] + [f"{m} samples/s" for m in PIPELINE_MODES], "ll" + "r" * len(PIPELINE_MODES),
                  rows)


PERF_MODES = ("fused_tfra", "fused_native")
# (row label, shared objects summed) of perf's --sort dso report.
PERF_ROWS = (("kernel (Gloo's transport, scheduling, and the idle loop)", ("[kernel.kallsyms]",)),
             ("libpython (the step's Python, tf.data)", ("libpython3.11.so.1.0",)),
             ("libtensorflow_cc + libtensorflow_framework (op glue, the dense model)",
              ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")),
             ("TFRA's cuckoo hash table (`_cuckoo_hashtable_ops.so`)", ("_cuckoo_hashtable_ops.so",)),
             ("tf_fusedrec's ops (`_fusedrec_ops.so`: unique, partition, and the native table)", ("_fusedrec_ops.so",)),
             ("libc (memmove, malloc)", ("libc.so.6",)))
STEP_LINE = re.compile(r"rank (\d+) \S+: ([\d.]+) ms/step, cpu ([\d.]+) ms/step")


def _perf_run(prefix):
    """A perf run's files (PREFIX-step.txt, PREFIX-dso.txt) -> ({rank: (ms/step, CPU ms/step)}, {shared object: % of
    all samples})."""
    with open(_path(f"{prefix}-step.txt")) as f:
        steps = {int(m[1]): (m[2], m[3]) for m in STEP_LINE.finditer(f.read())}
    shares = {}
    with open(_path(f"{prefix}-dso.txt")) as f:
        for line in f:
            percent, dso = line.strip().split(None, 1)
            shares[dso.strip()] = shares.get(dso.strip(), 0.0) + float(percent.rstrip("%"))
    return steps, shares


def perf_breakdown():
    """benchmarks/results/perf: the step lines of prof_step.py and perf's share of all samples per shared object."""
    steps, shares = {}, {}
    for mode in PERF_MODES:
        steps[mode], shares[mode] = _perf_run(f"benchmarks/results/perf/{mode}")
    rows = [["step (rank 0), ms"] + [steps[m][0][0] for m in PERF_MODES],
            ["CPU per step (rank 0 / rank 1), ms"] + [f"{steps[m][0][1]} / {steps[m][1][1]}" for m in PERF_MODES]]
    for label, dsos in PERF_ROWS:
        cells = []
        for m in PERF_MODES:
            found = [shares[m][d] for d in dsos if d in shares[m]]
            cells.append(f"{sum(found):.2f}%" if found else "-")
        rows.append([label] + cells)
    return _table(["share of all samples"] + list(PERF_MODES), "lrr", rows)


def _commit_runs(pattern):
    """[(run number, placement, {"base": bench.json, "head": bench.json})] of benchmarks/training/bench_commits.sh's
    {base,head}-{pinned,unpinned}-N directories: by run number, pinned before unpinned."""
    runs = {}
    for path in _run_dirs(pattern):
        tree, placement, number = os.path.basename(path).split("-")
        runs.setdefault((int(number), placement != "pinned", placement), {})[tree] = _json(
            os.path.join(path, "bench.json"))
    return [(str(n), placement, pair) for (n, _, placement), pair in sorted(runs.items())]


def bench_step_cost(directory="benchmarks/results/bench/step_cost", modes=("fused",)):
    """`directory`: samples/s of `modes` and rank 0's CPU per step before a change (base) and with it (head), the
    two trees alternating (benchmarks/training/bench_commits.sh); a mode column where there are several modes."""
    rows = []
    for run, placement, pair in _commit_runs(f"{directory}/*/bench.json"):
        for mode in modes:
            base, head = (pair[t]["modes"][mode] for t in ("base", "head"))
            rows.append([run, placement] + ([mode] if len(modes) > 1 else []) + [
                f"{base['samples_per_s']:,.0f}", f"{head['samples_per_s']:,.0f}",
                f"{head['samples_per_s'] / base['samples_per_s']:.2f}x",
                f"{base['cpu_seconds_per_step'] * 1e3:.1f} / {head['cpu_seconds_per_step'] * 1e3:.1f}"])
    mode_column = ["mode"] if len(modes) > 1 else []
    return _table(["run", "placement"] + mode_column + ["base samples/s", "head samples/s", "head / base",
                                                        "CPU ms / step, rank 0 (base / head)"],
                  "ll" + "l" * len(mode_column) + "rrrr", rows)


def bench_commit_modes(directory, modes):
    """`directory` (benchmarks/training/bench_commits.sh): per run and tree (base, head), samples/s and rank 0's CPU per step of
    each mode, head's ratio to base of the same run, and fused against the other modes of the same tree and run."""
    rows = []
    for run, placement, pair in _commit_runs(f"{directory}/*/bench.json"):
        for tree in ("base", "head"):
            m = pair[tree]["modes"]
            cells = [_rate_cpu_cell(m[mode], pair["base"]["modes"][mode] if tree == "head" else None)
                     for mode in modes]
            rows.append([run, placement, tree] + cells + _fused_versus(m, [k for k in modes if k != "fused"]))
    return _table(["run", "placement", "tree"] + [f"{k} samples/s, CPU / step (rank 0)" for k in modes]
                  + [f"fused vs {k}" for k in modes if k != "fused"], "lll" + "r" * (2 * len(modes) - 1), rows)


INTERACTION_OPS = ("BatchMatMulV2", "FusedRec>UpperTriangle", "FusedRec>UpperTriangleGrad", "FusedRec>DotInteraction",
                   "FusedRec>DotInteractionGrad")


def perf_op_profile():
    """benchmarks/results/perf/op_profile/{base,head}.json (benchmarks/profiling/op_profile.py, one worker, in the tree before and after
    ops.dot_interaction): per mode, the step, CPU per step, and the op time of DLRM's interaction (the ops of
    INTERACTION_OPS present) and of the dense layers' matmuls."""
    trees = {t: _json(f"benchmarks/results/perf/op_profile/{t}.json")["modes"] for t in ("base", "head")}
    rows = []
    for mode in trees["head"]:
        for tree in ("base", "head"):
            m = trees[tree][mode]
            ops = m["ops"]
            present = [k for k in INTERACTION_OPS if k in ops]
            interaction = sum(ops[k]["ms_per_step"] for k in present)
            names = ", ".join(f"{k.replace('FusedRec>', '')} {ops[k]['ms_per_step']:.2f}" for k in present)
            matmul = sum(ops[k]["ms_per_step"] for k in ("MatMul", "_FusedMatMul") if k in ops)
            rows.append([mode, tree, f"{m['step_ms']:.1f}", f"{m['cpu_ms_per_step']:.1f}", f"{interaction:.2f} ({names})",
                         f"{matmul:.2f}"])
    return _table(["mode", "tree", "step ms", "CPU ms / step", "interaction ops, ms / step", "MatMul + _FusedMatMul, ms / step"],
                  "llrrlr", rows)


# The ops of the stack, its unstack and the interaction, with and without the list form of dot_interaction (reverted;
# its profiles stay under benchmarks/results/perf/op_profile/list_form).
LIST_FORM_OPS = ("Pack", "Unpack", "FusedRec>DotInteraction", "FusedRec>DotInteractionGrad", "FusedRec>DotInteractionN",
                 "FusedRec>DotInteractionNGrad")


def perf_op_ab(directory, modes, op_names):
    """`directory`/{base,head}-N.json (benchmarks/profiling/op_profile.py, the two trees alternating): per mode, run and tree, the
    step and CPU per step, each of `op_names`' time per step (- where the tree has no such op) and their sum."""
    paths = sorted(glob.glob(_path(f"{directory}/*.json")),
                   key=lambda q: (int(os.path.basename(q)[:-len(".json")].split("-")[1]), q))
    rows = []
    for mode in modes:
        for path in paths:
            tree, n = os.path.basename(path)[:-len(".json")].split("-")
            m = _json(os.path.relpath(path, _path(".")))["modes"][mode]
            times = [m["ops"][k]["ms_per_step"] if k in m["ops"] else None for k in op_names]
            rows.append([mode, n, tree, f"{m['step_ms']:.1f} / {m['cpu_ms_per_step']:.1f}"]
                        + ["-" if t is None else f"{t:.3f}" for t in times]
                        + [f"{sum(t for t in times if t is not None):.3f}"])
    return _table(["mode", "run", "tree", "step / CPU ms"] + [f"{k.replace('FusedRec>', '')} ms" for k in op_names]
                  + ["sum ms"], "lll" + "r" * (len(op_names) + 2), rows)


def perf_op_profile_runs():
    """benchmarks/results/perf/op_profile/runs/{base,head}-N.json (benchmarks/profiling/op_profile.py --modes fused,dense_only --steps 60, the
    trees alternating): one worker's fused and dense_only steps, unprofiled, and their ratio."""
    rows = []
    for path in sorted(glob.glob(_path("benchmarks/results/perf/op_profile/runs/*.json")),
                       key=lambda q: (os.path.basename(q).split("-")[1], q)):
        tree, n = os.path.basename(path)[:-len(".json")].split("-")
        m = _json(os.path.relpath(path, _path(".")))["modes"]
        rows.append([n, tree] + [f"{m[k]['step_ms']:.1f} / {m[k]['cpu_ms_per_step']:.1f}" for k in ("fused", "dense_only")]
                    + [f"{m['fused']['step_ms'] / m['dense_only']['step_ms']:.2f}x"])
    return _table(["run", "tree", "fused step / CPU ms", "dense_only step / CPU ms", "fused step vs dense_only"],
                  "llrrr", rows)


def bench_head_runs(directory, modes):
    """`directory`/head-N (python -m tf_fusedrec.bench, one tree, repeated): per run, samples/s and rank 0's CPU per
    step of each mode, and fused against the others of the same run."""
    runs = _value_runs(directory)
    rows = []
    for n in sorted(runs):
        m = runs[n]["head"]
        rows.append([n] + [_rate_cpu_cell(m[k]) for k in modes] + _fused_versus(m, [k for k in modes if k != "fused"]))
    return _table(["run"] + [f"{k} samples/s, CPU / step (rank 0)" for k in modes]
                  + [f"fused vs {k}" for k in modes if k != "fused"], "l" + "r" * (2 * len(modes) - 1), rows)


def bench_cycle_time():
    """benchmarks/results/bench/cycle_time: `fused` samples/s on 2 pinned workers per HOROVOD_CYCLE_TIME (benchmarks/training/bench_env.sh),
    each run's values alternating, and the median over the runs."""
    runs = {}
    for path in _run_dirs("benchmarks/results/bench/cycle_time/*/bench.json"):
        value, number = os.path.basename(path).rsplit("-", 1)
        runs.setdefault(value, {})[int(number)] = _json(os.path.join(path, "bench.json"))["modes"]["fused"]
    values = sorted(runs, key=lambda v: (v != "default", float(v) if v != "default" else 0.0))
    numbers = sorted({n for r in runs.values() for n in r})
    rows = []
    for v in values:
        rates = [runs[v][n]["samples_per_s"] for n in numbers if n in runs[v]]
        median = sorted(rates)[len(rates) // 2]
        rows.append([v if v != "default" else "unset (Horovod's default)"]
                    + [f"{runs[v][n]['samples_per_s']:,.0f}" if n in runs[v] else "-" for n in numbers]
                    + [f"{median:,.0f}"])
    return _table(["HOROVOD_CYCLE_TIME (ms)"] + [f"run {n} samples/s" for n in numbers] + ["median"],
                  "l" + "r" * (len(numbers) + 1), rows)


# (row label, symbol substrings summed) of perf's --sort dso,sym report (its 60 largest symbols).
PERF_SYMBOL_ROWS = (("TensorFlow's gathers (`HandleCopies`)", ("HandleCopies",)),
                    ("TensorFlow's segment sums (`UnsortedSegment`)", ("UnsortedSegment",)),
                    ("TensorFlow's `Where`", ("WhereCPUOp",)),
                    ("tf_fusedrec's output sums and interaction pairs", ("GatherSegmentSum", "UpperTriangle")))


def _graph_size_runs(directory):
    """(tree, mode, record, median CPU s to build, trace and run one step) of benchmarks/profiling/graph_size.py's
    directory/graph-{base,head}.json."""
    for tree in ("base", "head"):
        for mode, r in _json(f"{directory}/graph-{tree}.json")["modes"].items():
            seconds = sorted(r["build_trace_step_cpu_seconds"])
            yield tree, mode, r, seconds[len(seconds) // 2]


def graph_size():
    """benchmarks/profiling/graph_size.py before the change (base: fused) and with it (head: fused and fused_chain)."""
    rows = []
    for tree, mode, r, median_s in _graph_size_runs("benchmarks/results/perf/step_cost"):
        types = r["by_type"]
        rows.append([tree, mode, f"{r['ops']:,}", str(types["Assert"] + types["If"]),
                     str(types["GatherV2"] + types["UnsortedSegmentSum"] + types["Where"]), f"{median_s:.2f}"])
    return _table(["tree", "mode", "ops in the step's graph", "Assert + If", "GatherV2 + UnsortedSegmentSum + Where",
                   "CPU s to build, trace, run one step (median)"], "llrrrr", rows)


def graph_ops():
    """benchmarks/profiling/graph_size.py before the row-id and check change (base) and with it (head), fused and per_feature."""
    rows = [[tree, mode, f"{r['ops']:,}", f"{median_s:.2f}"]
            for tree, mode, r, median_s in _graph_size_runs("benchmarks/results/perf/graph_ops")]
    return _table(["tree", "mode", "ops in the step's graph", "CPU s to build, trace, run one step (median)"], "llrr",
                  rows)


def graph_tfra():
    """benchmarks/profiling/graph_size.py before the TFRA-path change (base, 5ace59d) and with it (head): modes on TFRA tables."""
    rows = [[tree, mode, f"{r['ops']:,}", f"{median_s:.2f}"]
            for tree, mode, r, median_s in _graph_size_runs("benchmarks/results/perf/graph_tfra")]
    return _table(["tree", "mode", "ops in the step's graph", "CPU s to build, trace, run one step (median)"], "llrr",
                  rows)


def perf_step_cost():
    """benchmarks/results/perf/step_cost: benchmarks/profiling/perf_step.sh before this change (base) and with it (head)."""
    modes = ("base", "head")
    steps, shares, symbols = {}, {}, {}
    for mode in modes:
        steps[mode], shares[mode] = _perf_run(f"benchmarks/results/perf/step_cost/{mode}")
        with open(_path(f"benchmarks/results/perf/step_cost/{mode}-sym.txt")) as f:
            symbols[mode] = [(float(line.split()[0].rstrip("%")), line) for line in f if line.strip()]
    rows = [["step (rank 0), ms"] + [steps[m][0][0] for m in modes],
            ["CPU per step (rank 0 / rank 1), ms"] + [f"{steps[m][0][1]} / {steps[m][1][1]}" for m in modes]]
    jit = ("oneDNN's generated code (the dense model's matmuls)", ())
    for label, dsos in PERF_ROWS[:3] + (jit,) + PERF_ROWS[4:]:
        cells = []
        for m in modes:
            found = [v for d, v in shares[m].items() if d in dsos or (not dsos and d.startswith("[JIT]"))]
            cells.append(f"{sum(found):.2f}%" if found else "-")
        rows.append([label] + cells)
    for label, parts in PERF_SYMBOL_ROWS:
        rows.append([f"of which {label}"] + [
            f"{sum(v for v, line in symbols[m] if any(p in line for p in parts)):.2f}%" for m in modes])
    return _table(["share of all samples", "base", "head"], "lrr", rows)


def _perf_shares(prefixes, dso_rows):
    """The rows of a table of benchmarks/profiling/perf_step.sh runs side by side (PREFIX-{step,dso,sym}.txt each): the step and
    CPU, the kernel's idle loop and the rest of it, Open MPI's libraries, then `dso_rows` ((label, shared objects);
    no objects: oneDNN's generated code, perf's [JIT] entries)."""
    steps, shares, idle = {}, {}, {}
    for prefix in prefixes:
        steps[prefix], shares[prefix] = _perf_run(prefix)
        with open(_path(f"{prefix}-sym.txt")) as f:
            idle[prefix] = sum(float(line.split()[0].rstrip("%")) for line in f if "pv_native_safe_halt" in line)
    mpi_libs = ("libfabric", "mca_", "libopen-pal", "libopen-rte", "libmpi")
    rows = [["step (rank 0), ms"] + [steps[r][0][0] for r in prefixes],
            ["CPU per step (rank 0 / rank 1), ms"] + [f"{steps[r][0][1]} / {steps[r][1][1]}" for r in prefixes],
            ["kernel: the idle loop (`pv_native_safe_halt`)"] + [f"{idle[r]:.2f}%" for r in prefixes],
            ["kernel: the rest (TCP loopback, epoll, scheduling, page faults)"]
            + [f"{shares[r].get('[kernel.kallsyms]', 0.0) - idle[r]:.2f}%" for r in prefixes],
            ["Open MPI's libraries (`libfabric`, `mca_btl_*`, `libopen-pal`, `libmpi`)"]
            + [f"{sum(v for d, v in shares[r].items() if d.startswith(mpi_libs)):.2f}%" for r in prefixes]]
    for label, dsos in dso_rows:
        cells = []
        for r in prefixes:
            found = [v for d, v in shares[r].items() if d in dsos or (not dsos and d.startswith("[JIT]"))]
            cells.append(f"{sum(found):.2f}%" if found else "-")
        rows.append([label] + cells)
    return rows


JIT_ROW = ("oneDNN's generated code (the dense model's matmuls)", ())


def perf_transport():
    """benchmarks/results/perf/transport/{gloo,mpi,mpi_yield}: benchmarks/profiling/perf_step.sh fused, pinned, launched over Gloo, over Open MPI
    with its ranks spinning while they wait (before comm.OPEN_MPI_DEFAULTS), and over Open MPI with them yielding."""
    rows = _perf_shares([f"benchmarks/results/perf/transport/{r}" for r in ("gloo", "mpi", "mpi_yield")],
                        PERF_ROWS[1:3] + (JIT_ROW,) + PERF_ROWS[4:])
    return _table(["share of all samples", "Gloo", "MPI, ranks spinning", "MPI, ranks yielding (default)"], "lrrr",
                  rows)


def perf_step_1127(directory="benchmarks/results/perf/step_1127"):
    """directory/{issue-gloo,head-gloo,head-mpi}: benchmarks/profiling/perf_step.sh fused in the tree issue 20 measured (396d1ef,
    its own op library) and in the tree of 2026-11-27, under the issue's launch (Gloo, unpinned), and this tree under
    make bench's (Open MPI, pinned)."""
    rows = _perf_shares([f"{directory}/{r}" for r in ("issue-gloo", "head-gloo", "head-mpi")],
                        PERF_ROWS[1:] + (JIT_ROW,))
    return _table(["share of all samples", "396d1ef, Gloo, unpinned (issue 20's)", "this tree, Gloo, unpinned",
                   "this tree, Open MPI, pinned (`make bench`)"], "lrrr", rows)


MODEL_CHOICE = " (model's choice)"


def _hot_sweep(name):
    d = _json(name)
    base = next(e for e in d["results"] if e["rows"] == 0)
    rows = [[f"{e['rows']}{MODEL_CHOICE if e['rows'] == d['model_rows'] else ''}",
             f"{e['samples_per_s']:,.0f}", f"{1e3 * e['step_seconds']:.1f}", f"{e['alltoall_bytes_per_step']:,.0f}",
             f"{e['alltoall_bytes_per_step'] / base['alltoall_bytes_per_step']:.2f}",
             f"{1e3 * e['alltoall_busy_seconds_per_step']:.1f}", f"{1e3 * e['predicted_seconds']:.2f}"]
            for e in d["results"]]
    return _table(["R (rows per group)", "samples/s", "step ms", "all-to-all bytes / step", "bytes vs R=0",
                   "all-to-all in flight ms / step", "model L(R) ms"], "rrrrrrr", rows)


def hot_sweep_loopback():
    return _hot_sweep("benchmarks/results/hot/hot_sweep.json")


def hot_sweep_1gbit():
    return _hot_sweep("benchmarks/results/hot/1gbit-n2/hot_sweep.json")


def _num(x, spec):
    return "-" if x is None else format(x, spec)


def serve_bench(path="benchmarks/results/serve/serve_bench.json"):
    """tf_fusedrec/serve/bench.py's table (benchmarks/results/serve/serve_bench.md shows the same)."""
    rows = []
    for r in _json(path)["runs"]:
        kb = [_num(None if r[k] is None else r[k] / 1e3, ".1f")
              for k in ("bytes_from_servers_per_request", "bytes_to_servers_per_request")]
        rows.append(["on" if r["pooling"] else "off", f"{r['cache_mb']:g} MiB" if r["cache_mb"] else "off", r["load"],
                     f"{r['offered_qps']:g}", f"{r['requests_per_s']:.1f}", _num(r["p50_ms"], ".1f"),
                     _num(r["p99_ms"], ".1f"), r["errors"], r["dropped"], _num(r["cache_hit_rate"], ".3f"), *kb,
                     _num(r["ranker_mean_batch"], ".0f")])
    return _table(["pooling", "cache", "load", "offered q/s", "achieved req/s", "p50 ms", "p99 ms", "errors", "dropped",
                   "cache hit rate", "KB from servers / req", "KB to servers / req", "mean batch"], "l" * 13, rows)


def serve_curve(path="benchmarks/results/serve/serve_curve.json"):
    """tf_fusedrec/serve/bench.py's saturation curve (benchmarks/results/serve/serve_bench.md shows the same; the plot is
    serve_curve.png beside it)."""
    rows = []
    for p in _json(path)["points"]:
        cpu = p.get("cpu_s_per_s") or {}
        rows.append([f"{p['offered_qps']:g}", f"{p['requests_per_s']:.1f}", f"{p['instances_per_s']:,.0f}",
                     _num(p["p50_ms"], ".1f"), _num(p["p99_ms"], ".1f"), p["errors"], p["dropped"],
                     _num(p["cache_hit_rate"], ".3f"), _num(p["ranker_mean_batch"], ".0f"),
                     *(_num(cpu.get(k), ".2f") for k in ("ranker", "servers", "load_generator"))])
    return _table(["offered q/s", "achieved req/s", "achieved inst/s", "p50 ms", "p99 ms", "errors", "dropped",
                   "cache hit rate", "mean batch", "CPU s/s ranker", "CPU s/s servers", "CPU s/s load generator"],
                  "l" * 12, rows)


def serve_targets(directories):
    """Issue 22's latency and saturation targets per serve bench run (directory/serve_bench.json and serve_curve.json
    of `python -m tf_fusedrec.serve.bench --curve-pooling off --curve-cache off`): p50 at the low load (5 q/s, ranker
    without pooling and cache), the most served, the highest offered rate answered whole, and p99 at the offered rate
    nearest half of the most served."""
    rows = []
    for directory in directories:
        low = next(r for r in _json(f"{directory}/serve_bench.json")["runs"]
                   if not r["pooling"] and not r["cache_mb"] and r["load"] == "low")
        points = _json(f"{directory}/serve_curve.json")["points"]
        best = max(points, key=lambda p: p["requests_per_s"])
        whole = max((p for p in points if not p["dropped"] and not p["errors"]), key=lambda p: p["offered_qps"])
        half = min(points, key=lambda p: abs(p["offered_qps"] - best["requests_per_s"] / 2))
        rows.append([directory, f"{low['p50_ms']:.1f}", f"{best['requests_per_s']:.1f} at {best['offered_qps']:g}",
                     f"{whole['offered_qps']:g}", f"{half['p99_ms']:.1f} at {half['offered_qps']:g}"])
    return _table(["run", "p50 ms at 5 q/s (target <= 10)", "most served req/s (at offered)",
                   "highest offered q/s answered whole", "p99 ms near half of the most served (target <= 50)"],
                  "lrrrr", rows)


def grm_quality(path="benchmarks/results/grm/quality/quality.json"):
    """benchmarks/grm/bench_grm_quality.sh's table: per data seed the held-out AUC of the GRM and of the DLRM baseline per
    task, the GRM's margin, and each model's training loss at a third, two thirds and the end of the run."""
    result = _json(path)
    runs = {(r["seed"], r["model"]): r for r in result["runs"]}
    seeds = sorted({r["seed"] for r in result["runs"]})
    steps = result["steps"]
    marks = [steps // 3, 2 * steps // 3, steps]

    def losses(run):
        curve = dict(map(tuple, run["loss_curve"]))
        return ", ".join(_num(curve.get(m), ".3f") for m in marks)

    rows = []
    for seed in seeds:
        grm, dlrm = runs[seed, "grm"], runs[seed, "dlrm"]
        rows.append([str(seed)] + [f"{grm['auc'][t]:.4f} / {dlrm['auc'][t]:.4f} ({grm['auc'][t] - dlrm['auc'][t]:+.4f})"
                                   for t in ("click", "conversion")] + [losses(grm), losses(dlrm)])
    mean = result["mean_grm_minus_dlrm_auc"]
    rows.append(["mean", f"({mean['click']:+.4f})", f"({mean['conversion']:+.4f})", "", ""])
    return _table(["data seed", "click AUC: GRM / DLRM (GRM - DLRM)", "conversion AUC: GRM / DLRM (GRM - DLRM)",
                   f"GRM train loss at steps {marks[0]}, {marks[1]}, {marks[2]}", "DLRM train loss, same steps"],
                  "lrrrr", rows)


def grm_speed(directory="benchmarks/results/grm/profile"):
    """directory/{pairs,op}-{median32,median100,train2}-N.json (its run.sh): the GRM's pair-list attention against
    the attention op, alternated: one worker's step and tokens/s at median history lengths 32 and 100 (capped at
    200), and 2 workers' tokens/s in the train app; the op's ratio to the pairs of the same round."""
    rows = []
    rounds = sorted({int(os.path.basename(p)[:-5].rsplit("-", 1)[1])
                     for p in glob.glob(_path(f"{directory}/*-train2-*.json"))})
    for n in rounds:
        got = {}
        for variant in ("pairs", "op"):
            one = [_json(f"{directory}/{variant}-median{m}-{n}.json") for m in (32, 100)]
            train = _json(f"{directory}/{variant}-train2-{n}.json")
            got[variant] = [r["tokens_per_s"] for r in one] + [train["tokens_per_s"]]
            rows.append([str(n), variant] + [f"{r['step_ms']:.1f} ms, {r['tokens_per_s']:,.0f}" for r in one]
                        + [f"{train['tokens_per_s']:,.0f}"])
        rows.append([str(n), "op / pairs"] + [f"{a / b:.2f}x" for a, b in zip(got["op"], got["pairs"])])
    return _table(["round", "attention", "1 worker, median 32: step, tokens/s", "1 worker, median 100 (cap 200): step, "
                   "tokens/s", "2 workers, train app: tokens/s"], "llrrr", rows)


def grm_speed_ops(directory="benchmarks/results/grm/profile", median=100, n=1, top=8):
    """The largest op types of a GRM step (directory/{pairs,op}-median{median}-{n}.json): ms a step, before and
    after (the function call's own type left out: it holds the whole step)."""
    before = _json(f"{directory}/pairs-median{median}-{n}.json")
    after = _json(f"{directory}/op-median{median}-{n}.json")
    names = [k for k in before["ops"] if k != "Process"][:top]
    names += [k for k in after["ops"] if k != "Process" and k not in names][:3]
    rows = [[name] + [_num(r["ops"].get(name, {}).get("ms_per_step"), ".1f") for r in (before, after)]
            for name in names]
    rows.append(["step (wall)", f"{before['step_ms']:.1f}", f"{after['step_ms']:.1f}"])
    return _table(["op type", "pair-list attention, ms / step", "attention op, ms / step"], "lrr", rows)


def _variant_rounds(directory, variants, prefix=""):
    """[(round, variant, path)] of directory/PREFIXVARIANT-N.json for the given variants (an A/B run.sh's files), by
    round and, within a round, in the order of `variants` (the order the run.sh ran them)."""
    found = []
    for variant in variants:
        for path in glob.glob(_path(f"{directory}/{prefix}{variant}-*.json")):
            found.append((int(os.path.basename(path)[:-5].rsplit("-", 1)[1]), variants.index(variant), path))
    return [(str(n), variants[v], path) for n, v, path in sorted(found)]


def grm_movielens_like(directory="benchmarks/results/grm/movielens_like", steps=2000):
    """directory/{pairs,op}-N.json (its run.sh): configs/movielens1m_seq.yaml on MovieLens-1M-sized made-up ratings,
    2 workers: tokens/s, samples/s, the run's wall time, and the minutes `steps` steps take at that rate (the config's
    2000; batch 128 per worker)."""
    rows = []
    for n, variant, path in _variant_rounds(directory, ("pairs", "op")):
        s = _json(path)
        per_step = s["batch_size_per_worker"] * s["workers"]
        rows.append([n, "pair list" if variant == "pairs" else "op", f"{s['tokens_per_s']:,.0f}",
                     f"{s['samples_per_s']:,.0f}", f"{s['steps']} in {s['wall_s']:.0f} s",
                     f"{steps * per_step / s['samples_per_s'] / 60:.1f}"])
    return _table(["round", "attention", "tokens/s", "samples/s", "steps in wall time (start included)",
                   f"minutes for {steps} steps at that rate"], "llrrrr", rows)


def _probes():
    """{network: (run dir, probe.json)} of the 2-worker probes, loopback first, then by rate."""
    probes = {}
    for path in _run_dirs("benchmarks/results/cluster/*-n2/probe.json"):
        p = _json(os.path.join(path, "probe.json"))
        probes[p["network"]] = (os.path.basename(path), p)
    return {n: probes[n] for n in _by_rate(probes)}


def bench_vs_396d1ef(directory="benchmarks/results/bench/vs_396d1ef"):
    """directory/{launch}-{base,head}-N/bench.json (its run.sh): `fused` on 2 workers in the tree issue 20 measured
    (396d1ef) and in the tree of the run, alternating, per launch: samples/s, rank 0's CPU a step, and the ratio."""
    runs = {}
    for path in _run_dirs(f"{directory}/*/bench.json"):
        launch, tree, n = os.path.basename(path).rsplit("-", 2)
        runs.setdefault((launch, int(n)), {})[tree] = _json(os.path.join(path, "bench.json"))["modes"]["fused"]
    rows = []
    for (launch, n), trees in sorted(runs.items()):
        base, head = trees["base"], trees["head"]
        rows.append([str(n), launch] + [f"{m['samples_per_s']:,.0f}, {m['cpu_seconds_per_step'] * 1e3:.1f} ms"
                                        for m in (base, head)]
                    + [f"{head['samples_per_s'] / base['samples_per_s']:.2f}x"])
    return _table(["run", "launch", "396d1ef: fused samples/s, CPU / step (rank 0)",
                   "this tree: fused samples/s, CPU / step (rank 0)", "this tree vs 396d1ef"], "llrrr", rows)


def bench_per_feature_ceiling(directory="benchmarks/results/bench/per_feature_ceiling"):
    """directory/run-N/bench.json (fused, per_feature, dense_only on 2 pinned workers over MPI): per run the three
    modes' samples/s and rank 0's CPU a step, fused against per_feature, and dense_only (no embedding work at all)
    against per_feature: the most any embedding layer could reach."""
    rows = []
    for path in _run_dirs(f"{directory}/run-*/bench.json"):
        m = _json(os.path.join(path, "bench.json"))["modes"]
        rows.append([path.rsplit("-", 1)[1]]
                    + [f"{m[k]['samples_per_s']:,.0f}, {m[k]['cpu_seconds_per_step'] * 1e3:.1f} ms"
                       for k in ("fused", "per_feature", "dense_only")]
                    + [f"{m[k]['samples_per_s'] / m['per_feature']['samples_per_s']:.2f}x"
                       for k in ("fused", "dense_only")])
    return _table(["run", "fused samples/s, CPU / step (rank 0)", "per_feature samples/s, CPU / step",
                   "dense_only samples/s, CPU / step", "fused vs per_feature",
                   "dense_only vs per_feature"], "lrrrrr", rows)


def _hostile_cells(result):
    """A bench_serve_hostile.py result -> [quiet p50/p99, hostile p50/p99 (ms, per phase), hostile p99 / quiet p99,
    malformed requests answered a phase]."""
    phases = result["phases"]

    def span(kind, key):
        values = [p[key] for p in phases if p["kind"] == kind]
        return ", ".join(f"{v:.1f}" for v in values)

    ratios = result["p99_ratio_hostile_to_quiet"]
    answered = [sum(p["fuzz_answers"].values()) for p in phases if p["kind"] == "hostile"]
    return [f"{span('quiet', 'p50_ms')} / {span('quiet', 'p99_ms')}",
            f"{span('hostile', 'p50_ms')} / {span('hostile', 'p99_ms')}",
            ", ".join(f"{r:.2f}x" for r in ratios), ", ".join(f"{a:,}" for a in answered)]


_HOSTILE_HEADER = ["quiet p50 / p99 ms", "hostile p50 / p99 ms", "hostile p99 / quiet p99",
                   "malformed answered a phase"]


def serve_async_hostile(directory="benchmarks/results/serve/async_server"):
    """directory/hostile-{threaded,async}-N.json (its run.sh): the well-formed client's latency quiet and beside the
    back-to-back fuzzer and 64 idle connections, with the thread-per-connection ranker and the asyncio one,
    alternated."""
    rows = []
    for n, variant, path in _variant_rounds(directory, ("threaded", "async"), prefix="hostile-"):
        rows.append([n, variant] + _hostile_cells(_json(path)))
    return _table(["round", "HTTP server"] + _HOSTILE_HEADER, "llrrrr", rows)


def serve_async_saturation(directory="benchmarks/results/serve/async_server"):
    """directory/saturation-{threaded,async}-N.json (its run.sh): open-loop 64-instance requests at 5, 160 and 320
    q/s offered (ranker without pooling or cache), per server and round: achieved req/s, p50 / p99, dropped."""
    rows = []
    for n, variant, path in _variant_rounds(directory, ("threaded", "async"), prefix="saturation-"):
        cells = []
        for run in sorted(_json(path)["runs"], key=lambda r: r["offered_qps"]):
            cells.append(f"{run['requests_per_s']:.1f}, {run['p50_ms']:.1f} / {run['p99_ms']:.1f} ms, "
                         f"{run['dropped']} dropped, {run['errors']} errors")
        rows.append([n, variant] + cells)
    return _table(["round", "HTTP server", "5 q/s offered: req/s, p50 / p99, dropped",
                   "160 q/s offered", "320 q/s offered"], "llrrr", rows)


def serve_tls_ab(directory="benchmarks/results/serve/tls_ab"):
    """directory/saturation.json and half.json (its run.sh): per repeat, plain and TLS on every hop alternated, the
    most served (past saturation) and p99 at half of plain's saturation, with TLS's ratio to plain; then the
    medians."""
    phases = {name: _json(f"{directory}/{name}.json") for name in ("saturation", "half")}

    def of(name, transport):
        return {r["repeat"]: r for r in phases[name]["runs"] if r["transport"] == transport}

    sat_plain, sat_tls, half_plain, half_tls = (of(n, t) for n in ("saturation", "half") for t in ("plain", "tls"))
    sat_qps, half_qps = (next(iter(runs.values()))["offered_qps"] for runs in (sat_plain, half_plain))

    def median(values):
        values = sorted(values)
        return (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2

    pairs = [(sat_plain[k]["requests_per_s"], sat_tls[k]["requests_per_s"], half_plain[k]["p99_ms"],
              half_tls[k]["p99_ms"]) for k in sorted(sat_plain)]
    rows = [[str(k + 1), f"{sp:.1f}", f"{st:.1f}", f"{st / sp:.2f}x", f"{hp:.1f}", f"{ht:.1f}", f"{ht / hp:.2f}x"]
            for k, (sp, st, hp, ht) in enumerate(pairs)]
    # The median of each column; in the ratio columns, the median of the repeats' ratios (each of an alternated pair).
    columns = list(zip(*pairs))
    rows.append(["median", *(f"{median(c):.1f}" for c in columns[:2]),
                 f"{median(st / sp for sp, st, _, _ in pairs):.2f}x", *(f"{median(c):.1f}" for c in columns[2:]),
                 f"{median(ht / hp for _, _, hp, ht in pairs):.2f}x"])
    return _table(["repeat", f"plain req/s at {sat_qps:g} q/s", "TLS req/s", "TLS / plain (target >= 0.8)",
                   f"plain p99 ms at {half_qps:g} q/s", "TLS p99 ms", "TLS / plain (target <= 1.25)"],
                  "lrrrrrr", rows)


def serve_malformed_gate(directory="benchmarks/results/serve/malformed_gate"):
    """directory/{off,on}-N.json (its run.sh): the hostile bench with --malformed-qps 0 (off) and the default 100
    (on), alternated."""
    rows = []
    for n, variant, path in _variant_rounds(directory, ("off", "on")):
        rows.append([n, "100 (default)" if variant == "on" else "0 (no gate)"] + _hostile_cells(_json(path)))
    return _table(["round", "--malformed-qps"] + _HOSTILE_HEADER, "llrrrr", rows)


def steps_per_call_more(directory):
    """directory/{one_worker,pipelines}/{1,4}-N: per run and K, fused on one worker, and fused_dbp and fused_fwp on two
    pinned workers over MPI (samples/s with the ratio to K = 1's, rank 0's CPU a step)."""
    one = _value_runs(f"{directory}/one_worker")
    two = _value_runs(f"{directory}/pipelines")
    rows = []
    for n in sorted(set(one) & set(two)):
        for k in ("1", "4"):
            cells = []
            for runs, mode in ((one, "fused"), (two, "fused_dbp"), (two, "fused_fwp")):
                base = runs[n]["1"][mode] if k != "1" else None
                cells.append(_rate_cpu_cell(runs[n][k][mode], base))
            rows.append([str(n), k] + cells)
    return _table(["run", "steps per call", "fused, 1 worker: samples/s, CPU / step", "fused_dbp, 2 workers",
                   "fused_fwp, 2 workers"], "llrrr", rows)


def cluster_probe():
    """`python -m tf_fusedrec.cluster.probe`'s fits per network: latency in ms, MB/s = 1 / seconds per byte."""
    rates = _rates()
    rows = []
    for net, (run, p) in _probes().items():
        a2a, ar = p["alltoall"], p["allreduce"]
        linked = a2a.get("seconds_per_link_byte") is not None
        shape = f"{p['hosts']} x {p['workers_per_host']}" if p["hosts"] > 1 else f"{p['hosts']} host"
        link = f"{1e-6 / a2a['seconds_per_link_byte']:.0f} ({rates[net] / 1e6:g})" if linked else "-"
        rows.append([run, net, f"{p['workers']} ({shape})", f"{a2a['latency_s'] * 1e3:.1f} ms",
                     f"{1e-6 / a2a['seconds_per_byte']:.0f}", link, f"{a2a['batched']['latency_s'] * 1e3:.1f} ms",
                     f"{ar['latency_s'] * 1e3:.1f} ms", f"{1e-6 / ar['seconds_per_byte']:.0f}"])
    return _table(["run", "network", "N (hosts x W)", "all-to-all latency", "all-to-all MB/s per message byte",
                   "MB/s per link byte (nominal)", "batched all-to-all latency", "allreduce latency",
                   "allreduce MB/s"], "lllrrrrrr", rows)


def cluster_bench(directory="benchmarks/results/cluster"):
    """The 2-worker cluster runs side by side (`directory`/*-n2/bench.json), as in the cost model's model.md; the
    traffic columns are the loopback run's (fused_hot's hot set, and so its bytes, differ between runs)."""
    runs = {}
    for path in _run_dirs(f"{directory}/*-n2/bench.json"):
        b = _json(os.path.join(path, "bench.json"))
        runs[b["network"]] = b
    nets = _by_rate(runs)
    first = runs[nets[0]]
    rows = []
    for m in first["modes"]:
        r = first["modes"][m]
        rows.append([m] + [f"{runs[n]['modes'][m]['samples_per_s']:,.0f}" for n in nets]
                    + [f"{r['alltoall_calls_per_step']:.0f}", f"{r['alltoall_bytes_per_step']:,.0f}"])
    for base in ("per_feature", "tfra_hand_fused"):
        rows.append([f"**fused vs {base}**"] + [
            f"**{runs[n]['modes']['fused']['samples_per_s'] / runs[n]['modes'][base]['samples_per_s']:.2f}x**"
            for n in nets] + ["", ""])
    header = ["mode"] + [f"{n} samples/s" for n in nets] + ["all-to-alls / step",
                                                             f"bytes / step (one worker, {nets[0]})"]
    return _table(header, "l" + "r" * (len(nets) + 2), rows)


CHECKED_MODES = ("fused", "per_feature", "fused_nodedup", "tfra_hand_fused", "fused_dbp", "fused_hot")


def model_checks():
    """The cost model's checks (benchmarks/results/cluster/model.json): measured / model ms per step, and the model's error."""
    d = _json("benchmarks/results/cluster/model.json")
    checks = [c for c in d["checks"] if c["kind"] == "check"]
    rows = []
    for net in _by_rate(dict.fromkeys(c["network"] for c in checks)):
        by_mode = {c["mode"]: c for c in checks if c["network"] == net}
        c = next(iter(by_mode.values()))
        label = f"{net}, N = {c['workers']} ({c['workers'] // c['workers_per_host']} x {c['workers_per_host']})"
        rows.append([label] + [f"{by_mode[m]['measured_s'] * 1e3:.0f} / {by_mode[m]['model_s'] * 1e3:.0f} "
                               f"({by_mode[m]['error']:+.0%})" for m in CHECKED_MODES])
    return _table(["run"] + list(CHECKED_MODES), "l" + "r" * len(CHECKED_MODES), rows)


SCORE_LABELS = {"model": "the cost model (tf_fusedrec/cluster/model.py)",
                "null": "a null model that ignores the network (t = L_m, the loopback step)"}


def model_scores():
    """The cost model's score beside the null model's, as `python -m tf_fusedrec.cluster.model` computed them
    (model.json's scores), for the run set and its rerun."""
    rows = []
    for name in ("benchmarks/results/cluster/model.json", "benchmarks/results/cluster/rerun/model.json"):
        for model, s in _json(name)["scores"].items():
            rows.append([f"`{os.path.dirname(name)}`", SCORE_LABELS[model], f"{s['within_25_percent']} of {s['checked']}",
                         f"{s['mean_abs_error']:.0%}", f"{s['max_abs_error']:.0%}"])
    return _table(["runs", "model", "within 25%", "mean abs error", "max abs error"], "llrrr", rows)


# (network, link, mode) per column: the links as checked at 1 Gbit/s, and wires without the token bucket.
PROJECTION_COLUMNS = (("1gbit", "shaped", "fused"), ("1gbit", "shaped", "per_feature"),
                      ("1gbit", "shaped", "tfra_hand_fused"), ("1gbit", "wire", "fused"),
                      ("1gbit", "wire", "per_feature"), ("100mbit", "wire", "fused"),
                      ("100mbit", "wire", "per_feature"))
PROJECTION_N = (8, 32, 128)


def model_projection():
    """The model's projection: ms per step (thousands of samples/s over all workers)."""
    by = {(p["network"], p["link"], p["mode"], p["workers"]): p for p in _json("benchmarks/results/cluster/model.json")["projection"]}
    header = ["N"] + [f"{net}{' wire' if link == 'wire' else ''} {mode}" for net, link, mode in PROJECTION_COLUMNS]
    rows = [[n] + [f"{by[c + (n,)]['model_s'] * 1e3:.0f} ({by[c + (n,)]['samples_per_s'] / 1e3:,.0f}k)"
                   for c in PROJECTION_COLUMNS] for n in PROJECTION_N]
    return _table(header, "r" * len(header), rows)


# name -> (the files it is read from, as the marker names them; the renderer)
def publish_training():
    """benchmarks/publishing/bench_publish.py: training samples/s with and without publishing, alternating (benchmarks/results/publish)."""
    runs = _json("benchmarks/results/publish/publish_bench.json")["runs"]
    rows = []
    for i, r in enumerate(runs):
        other = runs[i + 1] if r["mode"] == "publish" and i + 1 < len(runs) else None
        rows.append([r["mode"].replace("_", " "), r["repeat"], f"{r['step_samples_per_s']:,.0f}",
                     f"{r['publish_seconds']:.2f}", f"{r['samples_per_s']:,.0f}",
                     f"{r['samples_per_s'] / other['samples_per_s']:.2f}x" if other else ""])
    return _table(["run", "round", "samples/s of the steps", "s publishing", "samples/s with publishing",
                   "vs the run without after it"], "llrrrr", rows)


def publish_versions():
    """benchmarks/publishing/bench_publish.py: each published version's rows, bytes and freshness (benchmarks/results/publish)."""
    rows = []
    for r in _json("benchmarks/results/publish/publish_bench.json")["runs"]:
        for v in r.get("versions", []):
            rows.append([r["repeat"], v["version"], v["step"], "full" if v["full"] else "delta",
                         f"{v['rows_staged']:,}", f"{v['rows_held']:,}",
                         f"{v['rows_staged'] / max(v['rows_held'], 1):.0%}", f"{v['bytes_staged'] / 1e6:.1f}",
                         _num(v["freshness_s"], ".2f")])
    return _table(["round", "version", "step", "kind", "rows staged", "rows held", "staged / held", "MB staged",
                   "freshness s"], "lrrlrrrrr", rows)


def publish_long():
    """benchmarks/publishing/bench_publish.py --steps 2000: a delta's share of the rows held as the tables fill (benchmarks/results/publish/long):
    the first version, then every fifth."""
    runs = _json("benchmarks/results/publish/long/publish_bench.json")["runs"]
    rows = []
    for r in runs:
        versions = r.get("versions", [])
        for i, v in enumerate(versions):
            if i == 0 or (i + 1) % 5 == 0:
                rows.append([v["step"], "full" if v["full"] else "delta", f"{v['rows_staged']:,}", f"{v['rows_held']:,}",
                             f"{v['rows_staged'] / max(v['rows_held'], 1):.1%}", f"{v['bytes_staged'] / 1e6:.1f}",
                             f"{v['bytes_staged'] / max(v['rows_staged'], 1):.1f}", _num(v["freshness_s"], ".2f")])
    return _table(["step", "kind", "rows staged", "rows held", "staged / held", "MB staged", "bytes / row staged",
                   "freshness s"], "rlrrrrrr", rows)


def _percentile(values, q):
    """The q-th percentile of `values`, interpolated linearly between the closest ranks (numpy.percentile's default)."""
    values = sorted(values)
    at = (len(values) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def publish_tls_token_ab(directory="benchmarks/results/publish/tls_token_ab"):
    """benchmarks/publishing/bench_publish.py --transports plain,tls-token --modes publish (its run.sh): per round and
    transport, the full version's freshness, the deltas' p50 and max, the seconds publishing and the load average
    after the run; then, per transport, every round's deltas together (p50, p99, max)."""
    runs = [r for r in _json(f"{directory}/publish_bench.json")["runs"] if r["mode"] == "publish"]
    words = {"plain": "plain", "tls-token": "TLS + token"}

    def deltas(run):
        return [v["freshness_s"] for v in run["versions"] if not v["full"] and v["freshness_s"] is not None]

    rows = []
    for r in runs:
        full = [v["freshness_s"] for v in r["versions"] if v["full"]]
        d = deltas(r)
        rows.append([str(r["repeat"] + 1), words[r["transport"]], _num(full[0] if full else None, ".2f"),
                     f"{_percentile(d, 50):.2f}", "-", f"{max(d):.2f}", f"{len(d)}",
                     f"{r['publish_seconds']:.2f}", f"{r['loadavg'][0]:.1f}"])
    for transport in dict.fromkeys(r["transport"] for r in runs):
        mine = [r for r in runs if r["transport"] == transport]
        d = [f for r in mine for f in deltas(r)]
        full = [v["freshness_s"] for r in mine for v in r["versions"] if v["full"] and v["freshness_s"] is not None]
        rows.append(["all", words[transport], f"max {max(full):.2f}" if full else "-", f"{_percentile(d, 50):.2f}",
                     f"{_percentile(d, 99):.2f}", f"{max(d):.2f}", f"{len(d)}",
                     f"{sum(r['publish_seconds'] for r in mine) / len(mine):.2f} a run", ""])
    return _table(["round", "publishing", "full version s", "deltas' p50 s", "deltas' p99 s (target <= 10)",
                   "deltas' max s", "deltas", "s publishing", "load (1 min) after"], "llrrrrrrr", rows)


def publish_auc():
    """benchmarks/publishing/bench_freshness_auc.py: AUC of the served model on the coming batches per publish interval, per drift
    (benchmarks/results/publish/freshness_auc.json; the plot is benchmarks/results/publish/freshness_auc.png)."""
    drifts = _json("benchmarks/results/publish/freshness_auc.json")["drifts"]
    intervals = list(next(iter(drifts.values())))
    rows = [[f"{drift} ids/step", *(f"{by[n]['auc']:.4f}" for n in intervals),
             f"{by[intervals[-1]]['auc'] - by[intervals[0]]['auc']:+.4f}"] for drift, by in drifts.items()]
    return _table(["drift", *(f"N = {n}" for n in intervals), f"N = {intervals[-1]} - N = {intervals[0]}"],
                  "l" + "r" * (len(intervals) + 1), rows)


def publish_online_loop(path="benchmarks/results/publish/online_loop.json"):
    """benchmarks/publishing/bench_online_loop.py: per hour of the followed stream, the served model's freshness (the
    file landed -> the version that trained on it starts publishing -> first answered with it) and the AUC of the
    served and the frozen model on the hour's samples before training on them (plot: online_loop.png beside it)."""
    report = _json(path)
    rows = []
    for h in report["hours"]:
        served_by = ", ".join(f"{v} (to hour {t})" for v, t in zip(h["scored_by_versions"],
                                                                   h["scored_by_trained_through_hour"]))
        rows.append([h["hour"], _num(h["freshness_s"], ".2f"), f"{h['landed_to_publish_s']:.2f}",
                     _num(h["publish_to_served_s"], ".2f"), f"{h['version']} (step {h['version_step']})", served_by,
                     f"{h['auc_fresh']:.4f}", f"{h['auc_frozen']:.4f}", f"{h['auc_fresh'] - h['auc_frozen']:+.4f}"])
    f, auc = report["freshness_s"], report["auc"]
    rows.append(["all", f"p50 {f['p50']:.2f}, p99 {f['p99']:.2f}, max {f['max']:.2f}", "", "", "", "",
                 f"{auc['fresh_mean']:.4f} (mean)", f"{auc['frozen_mean']:.4f} (mean)",
                 f"{auc['fresh_mean'] - auc['frozen_mean']:+.4f}"])
    return _table(["hour", "freshness s", "landed -> publish s", "publish -> served s", "version trained on it",
                   "scored by version (trained to)", "AUC served", "AUC frozen", "served - frozen"], "lrrrllrrr", rows)


def tier_bench(directory="benchmarks/results/tier"):
    """benchmarks/tier/bench_tier.sh: per Zipf exponent, 2-worker samples/s with every row in DRAM and with tiered
    tables (each run's, alternating, and their medians), the tiered runs' DRAM hit rate, the milliseconds per step the
    store's reads and evictions took, and the workers' peak resident memory."""
    import statistics  # noqa: PLC0415

    rows = []
    for zipf_dir in sorted(glob.glob(os.path.join(ROOT, directory, "zipf*")), key=lambda d: float(d.split("zipf")[-1])):
        runs = {m: [_json(os.path.relpath(p, ROOT)) for p in sorted(glob.glob(os.path.join(zipf_dir, f"{m}-*",
                                                                                            "result.json")))]
                for m in ("dram", "tiered")}
        if not runs["dram"] or not runs["tiered"]:
            continue
        d = statistics.median(r["samples_per_s"] for r in runs["dram"])
        t = statistics.median(r["samples_per_s"] for r in runs["tiered"])
        workers = [w for r in runs["tiered"] for w in r["per_worker"]]
        first = runs["tiered"][0]
        rows.append([first["zipf"], ", ".join(f"{r['samples_per_s']:,.0f}" for r in runs["dram"]) + f" ({d:,.0f})",
                     ", ".join(f"{r['samples_per_s']:,.0f}" for r in runs["tiered"]) + f" ({t:,.0f})",
                     f"{t / d:.2f}x", f"{100 * statistics.median(w['hit_rate'] for w in workers):.1f}%",
                     f"{statistics.median(w['read_ms_per_step'] for w in workers):.1f} / "
                     f"{statistics.median(w['evict_ms_per_step'] for w in workers):.1f}",
                     f"{max(w['memory']['VmHWM'] for r in runs['dram'] for w in r['per_worker']) / 2**30:.2f} / "
                     f"{max(w['memory']['VmHWM'] for w in workers) / 2**30:.2f}"])
    return _table(["Zipf", "DRAM samples/s (median)", "tiered samples/s (median)", "tiered / DRAM",
                   "DRAM hit rate (tiered)", "store read / evict ms per step", "peak RSS GiB per worker, DRAM / tiered"],
                  "lrrrrrr", rows)


_CUDA_LINE = re.compile(r"^\s*(?P<case>\S+)\s+n=\s*(?P<n>\d+) unique=\s*(?P<unique>\d+)\s+segment_unique\s+(?P<ms>[\d.]+) ms.*?"
                        r"sort\+unique_by_key\s+(?P<sort_ms>[\d.]+) ms.*?speedup (?P<speedup>[\d.]+)x")


def _cuda_runs(path):
    """{harness basename: [{case: (n, unique, ms, sort_ms, speedup)} per round]} from a tests/cuda/bench_ab.sh log."""
    runs, current = {}, None
    with open(path) as f:
        for line in f:
            head = re.match(r"^== (\S+) round \d+", line)
            if head:
                current = {}
                runs.setdefault(os.path.basename(head.group(1)), []).append(current)
                continue
            m = _CUDA_LINE.match(line)
            if m and current is not None:
                current[m.group("case")] = (int(m.group("n")), int(m.group("unique")), float(m.group("ms")),
                                            float(m.group("sort_ms")), float(m.group("speedup")))
    return runs


def _span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else fmt.format(lo) + "-" + fmt.format(hi)


def cuda_bench():
    """The CUDA segment unique against CUB sort + unique, first kernels (harness_v1) and now (harness), per GPU."""
    rows = []
    for directory in sorted(glob.glob(_path("benchmarks/results/cuda/final_*"))):
        with open(os.path.join(directory, "device.txt")) as f:
            gpu = f.read().splitlines()[1].split(",")[0].replace("NVIDIA ", "")
        runs = _cuda_runs(os.path.join(directory, "ab.log"))
        first, now = runs["harness_v1"], runs["harness"]
        for case in now[0]:
            n, unique = now[0][case][:2]
            old_ms = [r[case][2] for r in first]
            new_ms = [r[case][2] for r in now]
            sort_ms = [r[case][3] for r in first + now]
            rows.append([gpu, case, f"{n:,}", f"{unique:,}", _span(old_ms, "{:.3f}"), _span(new_ms, "{:.3f}"),
                         _span(sort_ms, "{:.3f}"),
                         _span([r[case][4] for r in first], "{:.2f}x"), _span([r[case][4] for r in now], "{:.2f}x"),
                         len(now)])
    return _table(["GPU", "keys", "n", "unique", "first kernels, ms", "now, ms", "sort + unique, ms",
                   "first vs sort", "now vs sort", "rounds"], "llrrrrrrrr", rows)


TABLES = {
    "cuda-bench": (("benchmarks/results/cuda/final_*/ab.log", "benchmarks/results/cuda/final_*/device.txt"), cuda_bench),
    "grm-storage": (("benchmarks/results/grm/storage_bench.json",), grm_storage),
    "grm-storage-seeds": (("benchmarks/results/grm/storage_bench_float16_seeds.json",), grm_storage_seeds),
    "grm-storage-stochastic": (("benchmarks/results/grm/stochastic/storage_bench_float16_stochastic_seeds.json",),
                               grm_storage_stochastic),
    "grm-storage-noise": (("benchmarks/results/grm/noise/storage_bench_float32_noise_seeds.json",),
                          lambda: grm_storage_stochastic("benchmarks/results/grm/noise/storage_bench_float32_noise_seeds.json")),
    "bench-modes": (("benchmarks/results/bench.json",), bench_modes),
    "bench-sweep": (("benchmarks/results/bench.json",), bench_sweep),
    "pipeline-cpu": (("benchmarks/results/pipeline/cpu_profile.json",), pipeline_cpu),
    "pipeline-clustering": (("benchmarks/results/pipeline/clustering.json",), pipeline_clustering),
    "table-keys": (("benchmarks/results/table/table.json",), table_keys),
    "bench-table-backend": (("benchmarks/results/bench/table_backend/bench.json",), bench_table_backend),
    "bench-pinning": (("benchmarks/results/bench/pinning/*/bench.json",), bench_pinning),
    "bench-pipelines-native": (("benchmarks/results/bench/pipelines_native/*/bench.json",), bench_pipelines_native),
    "bench-transport": (("benchmarks/results/bench/transport/*/bench.json",), bench_transport),
    "bench-mpi-yield": (("benchmarks/results/bench/mpi_yield/*/bench.json",), bench_mpi_yield),
    "bench-malloc": (("benchmarks/results/bench/malloc/*/bench.json",), bench_malloc),
    "bench-malloc-thresholds": (("benchmarks/results/bench/malloc_thresholds/*/bench.json",), lambda: bench_malloc_thresholds(
        "benchmarks/results/bench/malloc_thresholds", TRANSPORT_MODES + ("dense_only",))),
    "bench-steps-per-call": (("benchmarks/results/bench/steps_per_call/*/bench.json",), bench_steps_per_call),
    "bench-malloc-thresholds-2": (("benchmarks/results/bench/malloc_thresholds_2modes/*/bench.json",), lambda: bench_malloc_thresholds(
        "benchmarks/results/bench/malloc_thresholds_2modes", ("fused", "tfra_hand_fused"))),
    "bench-transport-yield": (("benchmarks/results/bench/transport_yield/*/bench.json",),
                              lambda: bench_transport("benchmarks/results/bench/transport_yield")),
    "bench-pipelines-mpi": (("benchmarks/results/bench/pipelines_mpi/*/bench.json",),
                            lambda: bench_pipelines_native("benchmarks/results/bench/pipelines_mpi")),
    "perf-transport": (("benchmarks/results/perf/transport/*.txt",), perf_transport),
    "perf-breakdown": (("benchmarks/results/perf/*-step.txt", "benchmarks/results/perf/*-dso.txt"), perf_breakdown),
    "bench-step-cost": (("benchmarks/results/bench/step_cost/*/bench.json",), bench_step_cost),
    "bench-step-cost-modes": (("benchmarks/results/bench/step_cost_modes/bench.json",), bench_step_cost_modes),
    "bench-step-cost-1worker": (("benchmarks/results/bench/step_cost_1worker/bench.json",), bench_step_cost_1worker),
    "perf-step-cost": (("benchmarks/results/perf/step_cost/*.txt",), perf_step_cost),
    "graph-size": (("benchmarks/results/perf/step_cost/graph-*.json",), graph_size),
    "graph-ops": (("benchmarks/results/perf/graph_ops/graph-*.json",), graph_ops),
    "graph-tfra": (("benchmarks/results/perf/graph_tfra/graph-*.json",), graph_tfra),
    "bench-dot-interaction": (("benchmarks/results/bench/dot_interaction/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/dot_interaction", ("fused", "tfra_hand_fused", "per_feature", "dense_only"))),
    "perf-op-profile": (("benchmarks/results/perf/op_profile/*.json",), perf_op_profile),
    "perf-op-profile-runs": (("benchmarks/results/perf/op_profile/runs/*.json",), perf_op_profile_runs),
    "perf-op-profile-list-form": (("benchmarks/results/perf/op_profile/list_form/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/list_form", ("fused", "dense_only"), LIST_FORM_OPS)),
    "perf-op-profile-feature-major": (("benchmarks/results/perf/op_profile/feature_major/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/feature_major", ("fused", "dense_only"), LIST_FORM_OPS[:4])),
    "perf-op-profile-rows-grad": (("benchmarks/results/perf/op_profile/rows_grad/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/rows_grad", ("fused",),
        ("UnsortedSegmentSum", "FusedRec>GatherSegmentSum", "Cast", "Range"))),
    "bench-glue-ops": (("benchmarks/results/bench/glue_ops/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/glue_ops", ("fused", "tfra_hand_fused", "per_feature"))),
    "bench-feature-major": (("benchmarks/results/bench/feature_major/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/feature_major", ("fused", "tfra_hand_fused", "per_feature"))),
    "perf-op-profile-valid-ids": (("benchmarks/results/perf/op_profile/valid_ids/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/valid_ids", ("fused",), ("FusedRec>ValidIds", "FusedRec>IdExtremes", "GatherV2", "Where",
                                                       "GreaterEqual", "Min", "Max", "ConcatV2", "Identity"))),
    "perf-op-profile-unique-rows": (("benchmarks/results/perf/op_profile/unique_rows/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/unique_rows", ("fused",), ("FusedRec>GatherSegmentSum", "FusedRec>GatherSegmentSumGrad",
                                                         "GatherV2"))),
    "bench-valid-ids-2workers": (("benchmarks/results/bench/valid_ids_1127/2workers/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/valid_ids_1127/2workers", ("fused", "tfra_hand_fused"))),
    "bench-session-1127c": (("benchmarks/results/bench/session_1127c/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/session_1127c", ("fused", "tfra_hand_fused", "per_feature"))),
    "bench-session-1127b": (("benchmarks/results/bench/session_1127b/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/session_1127b", ("fused", "tfra_hand_fused", "per_feature"))),
    "bench-interaction-list": (("benchmarks/results/bench/interaction_list/*/bench.json",), lambda: bench_commit_modes(
        "benchmarks/results/bench/interaction_list", ("fused", "tfra_hand_fused", "per_feature"))),
    "perf-op-profile-interaction-prefetch": (("benchmarks/results/perf/op_profile/interaction_prefetch/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/interaction_prefetch", ("fused",),
        ("FusedRec>DotInteractionN", "FusedRec>DotInteractionNGrad"))),
    "perf-op-profile-distinct-keys": (("benchmarks/results/perf/op_profile/distinct_keys/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/distinct_keys", ("fused",), ("FusedRec>NativeTableApplySparse",))),
    "perf-op-profile-fuse-ids": (("benchmarks/results/perf/op_profile/fuse_ids/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/fuse_ids", ("fused",), ("FusedRec>FuseIds", "ConcatV2", "GatherV2", "FusedRec>RowIds",
                                                      "Pack"))),
    "bench-pipelines-1127": (("benchmarks/results/bench/pipelines_1127/*/bench.json",), lambda: bench_head_runs(
        "benchmarks/results/bench/pipelines_1127", ("fused", "fused_dbp", "fused_fwp", "tfra_hand_fused"))),
    "bench-interaction-list-head": (("benchmarks/results/bench/interaction_list_head/*/bench.json",), lambda: bench_head_runs(
        "benchmarks/results/bench/interaction_list_head", ("fused", "tfra_hand_fused", "per_feature"))),
    "perf-op-profile-interaction-list": (("benchmarks/results/perf/op_profile/interaction_list/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/interaction_list", ("fused", "dense_only"), LIST_FORM_OPS)),
    "perf-op-profile-interaction-list-pinned": (("benchmarks/results/perf/op_profile/interaction_list_pinned/*.json",),
                                                lambda: perf_op_ab("benchmarks/results/perf/op_profile/interaction_list_pinned",
                                                                   ("fused",), LIST_FORM_OPS)),
    "perf-op-profile-row-ids": (("benchmarks/results/perf/op_profile/row_ids/*.json",), lambda: perf_op_ab(
        "benchmarks/results/perf/op_profile/row_ids", ("fused", "tfra_hand_fused"), ("UpperBound", "FusedRec>RowIds"))),
    "bench-dot-interaction-head": (("benchmarks/results/bench/dot_interaction_head/*/bench.json",), lambda: bench_head_runs(
        "benchmarks/results/bench/dot_interaction_head", ("fused", "tfra_hand_fused", "per_feature"))),
    "bench-grad-blocks-head": (("benchmarks/results/bench/grad_blocks_head/*/bench.json",), lambda: bench_head_runs(
        "benchmarks/results/bench/grad_blocks_head", ("fused", "tfra_hand_fused", "per_feature"))),
    "bench-graph-ops": (("benchmarks/results/bench/graph_ops/*/bench.json",), lambda: bench_step_cost("benchmarks/results/bench/graph_ops")),
    "bench-trace-tfra": (("benchmarks/results/bench/trace_tfra/*/bench.json",),
                         lambda: bench_step_cost("benchmarks/results/bench/trace_tfra", ("per_feature", "fused_tfra"))),
    "bench-cycle-time": (("benchmarks/results/bench/cycle_time/*/bench.json",), bench_cycle_time),
    "bench-cycle-time-mpi": (("benchmarks/results/bench/cycle_time_mpi/*/bench.json",), lambda: bench_cycle_time_mpi(
        "benchmarks/results/bench/cycle_time_mpi", {"default": "unset (Horovod's 1)", "0.5": "0.5", "0.1": "0.1"})),
    "bench-cycle-time-mpi-modes": (("benchmarks/results/bench/cycle_time_mpi_modes/*/bench.json",), lambda: bench_cycle_time_mpi(
        "benchmarks/results/bench/cycle_time_mpi_modes", {"default": "unset (Horovod's 1)", "0.1": "0.1"})),
    "bench-cycle-time-mpi-default": (("benchmarks/results/bench/cycle_time_mpi_default/*/bench.json",), lambda: bench_cycle_time_mpi(
        "benchmarks/results/bench/cycle_time_mpi_default", {"1": "1 (Horovod's default)", "default": "unset: 0.1, the library's default"})),
    "readme-headline": (("benchmarks/results/bench/cycle_time_mpi_default/default-*/bench.json",), readme_headline),
    "hot-sweep": (("benchmarks/results/hot/hot_sweep.json",), hot_sweep_loopback),
    "hot-sweep-1gbit": (("benchmarks/results/hot/1gbit-n2/hot_sweep.json",), hot_sweep_1gbit),
    "serve-bench": (("benchmarks/results/serve/serve_bench.json",), serve_bench),
    "serve-tls-ab": (("benchmarks/results/serve/tls_ab/*.json",), serve_tls_ab),
    "serve-curve": (("benchmarks/results/serve/serve_curve.json",), serve_curve),
    "serve-bench-1127": (("benchmarks/results/serve/plain_1127/serve_bench.json",),
                         lambda: serve_bench("benchmarks/results/serve/plain_1127/serve_bench.json")),
    "serve-targets-1127": (("benchmarks/results/serve/plain_1127/serve_*.json", "benchmarks/results/serve/async_1127*/serve_*.json"),
                           lambda: serve_targets(["benchmarks/results/serve/plain_1127", "benchmarks/results/serve/async_1127",
                                                  "benchmarks/results/serve/async_1127_2"])),
    "serve-curve-async-1127": (("benchmarks/results/serve/async_1127/serve_curve.json",),
                               lambda: serve_curve("benchmarks/results/serve/async_1127/serve_curve.json")),
    "serve-curve-plain-1127": (("benchmarks/results/serve/plain_1127/serve_curve.json",),
                               lambda: serve_curve("benchmarks/results/serve/plain_1127/serve_curve.json")),
    "serve-curve-plain": (("benchmarks/results/serve/plain/serve_curve.json",),
                          lambda: serve_curve("benchmarks/results/serve/plain/serve_curve.json")),
    "publish-training": (("benchmarks/results/publish/publish_bench.json",), publish_training),
    "publish-versions": (("benchmarks/results/publish/publish_bench.json",), publish_versions),
    "publish-long": (("benchmarks/results/publish/long/publish_bench.json",), publish_long),
    "publish-auc": (("benchmarks/results/publish/freshness_auc.json",), publish_auc),
    "publish-tls-token-ab": (("benchmarks/results/publish/tls_token_ab/publish_bench.json",), publish_tls_token_ab),
    "publish-online-loop": (("benchmarks/results/publish/online_loop.json",), publish_online_loop),
    "tier-bench": (("benchmarks/results/tier/zipf*/*/result.json",), tier_bench),
    "cluster-probe": (("benchmarks/results/cluster/*-n2/probe.json", "benchmarks/results/cluster/model.json"), cluster_probe),
    "cluster-bench": (("benchmarks/results/cluster/*-n2/bench.json", "benchmarks/results/cluster/model.json"), cluster_bench),
    "bench-per-feature-ceiling": (("benchmarks/results/bench/per_feature_ceiling/*/bench.json",), bench_per_feature_ceiling),
    "bench-steps-per-call-1127": (("benchmarks/results/bench/steps_per_call_1127/*/bench.json",), lambda: _value_ab(
        "benchmarks/results/bench/steps_per_call_1127", ("1", "4"), "steps per call", str, ("fused", "tfra_hand_fused"))),
    "bench-steps-per-call-1127-more": (("benchmarks/results/bench/steps_per_call_1127/one_worker/*/bench.json",
                                        "benchmarks/results/bench/steps_per_call_1127/pipelines/*/bench.json"),
                                       lambda: steps_per_call_more("benchmarks/results/bench/steps_per_call_1127")),
    "perf-step-1127": (("benchmarks/results/perf/step_1127/*.txt",), perf_step_1127),
    "bench-vs-396d1ef": (("benchmarks/results/bench/vs_396d1ef/*/bench.json",), bench_vs_396d1ef),
    "cluster-bench-1127": (("benchmarks/results/cluster/run_1127/*-n2/bench.json", "benchmarks/results/cluster/model.json"),
                           lambda: cluster_bench("benchmarks/results/cluster/run_1127")),
    "serve-async-hostile": (("benchmarks/results/serve/async_server/hostile-*.json",), serve_async_hostile),
    "serve-async-saturation": (("benchmarks/results/serve/async_server/saturation-*.json",), serve_async_saturation),
    "serve-malformed-gate": (("benchmarks/results/serve/malformed_gate/*.json",), serve_malformed_gate),
    "grm-quality": (("benchmarks/results/grm/quality/quality.json",), grm_quality),
    "grm-speed": (("benchmarks/results/grm/profile/*.json",), grm_speed),
    "grm-movielens-like": (("benchmarks/results/grm/movielens_like/*.json",), grm_movielens_like),
    "grm-speed-ops": (("benchmarks/results/grm/profile/*-median100-1.json",), grm_speed_ops),
    "model-checks": (("benchmarks/results/cluster/model.json",), model_checks),
    "model-scores": (("benchmarks/results/cluster/model.json", "benchmarks/results/cluster/rerun/model.json"), model_scores),
    "model-projection": (("benchmarks/results/cluster/model.json",), model_projection),
}


def render(name):
    """The table `name` as Markdown, freshly read from its files."""
    return TABLES[name][1]()


def begin_marker(name, indent=""):
    return f"{indent}<!-- table:{name} from {', '.join(TABLES[name][0])} -->"


# --- the plots -------------------------------------------------------------------------------------------------------


def stale_plots():
    """The plots (of PLOTS) whose copy under docs/assets/ is missing or differs from the result file."""
    return [plot for plot in PLOTS if not os.path.exists(_path(f"{ASSETS}/{plot}"))
            or not filecmp.cmp(_path(f"{RESULTS}/{plot}"), _path(f"{ASSETS}/{plot}"), shallow=False)]


def copy_plots():
    """Copies each stale plot to docs/assets/; -> the plots copied."""
    plots = stale_plots()
    for plot in plots:
        os.makedirs(os.path.dirname(_path(f"{ASSETS}/{plot}")), exist_ok=True)
        shutil.copyfile(_path(f"{RESULTS}/{plot}"), _path(f"{ASSETS}/{plot}"))
    return plots


# --- the pages -------------------------------------------------------------------------------------------------------


def pages():
    """The Markdown files (relative to the root, sorted) that may hold generated tables."""
    return sorted({os.path.relpath(p, ROOT) for pattern in PAGES for p in glob.glob(_path(pattern), recursive=True)})


def blocks(text, where="text"):
    """[(name, indent, first line, end line, the lines between)] of the generated tables in `text` (0-based line
    numbers of the markers). Raises ValueError, naming `where` and the line, on an unknown name, a table marked twice
    or a marker left open."""
    lines = text.split("\n")
    found, seen, i = [], set(), 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if m:
            name = m["name"]
            if name not in TABLES:
                raise ValueError(f"{where} line {i + 1}: unknown table {name!r}; known: {', '.join(TABLES)}")
            if name in seen:
                raise ValueError(f"{where} line {i + 1}: table {name!r} is marked twice")
            seen.add(name)
            end = next((j for j in range(i + 1, len(lines)) if END.match(lines[j]) or BEGIN.match(lines[j])), None)
            if end is None or not END.match(lines[end]):
                raise ValueError(f"{where} line {i + 1}: table {name!r} has no <!-- /table --> before the next table")
            found.append((name, m["indent"], i, end, lines[i + 1:end]))
            i = end
        i += 1
    return found


def marked(texts):
    """{table name: page} over `texts` ({page: its text}). Raises ValueError for a table marked in two pages (and
    as blocks() does within a page)."""
    where = {}
    for page, text in texts.items():
        for name, *_ in blocks(text, page):
            if name in where:
                raise ValueError(f"{page}: table {name!r} is marked twice (also in {where[name]})")
            where[name] = page
    return where


def rewrite(text):
    """(text with every generated table rendered afresh, the names of the tables that changed)."""
    lines = text.split("\n")
    changed = []
    for name, indent, first, end, body in reversed(blocks(text)):
        # Blank lines around the table: Markdown then never reads a marker as a row of it.
        fresh = [""] + [indent + line for line in render(name).split("\n")] + [""]
        marker = begin_marker(name, indent)
        if fresh != body or marker != lines[first]:
            changed.append(name)
        lines[first:end] = [marker] + fresh
    return "\n".join(lines), changed[::-1]


def stale(text):
    """Names of the generated tables in `text` that differ from their data."""
    return rewrite(text)[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 naming the tables (and the plots' copies) that differ")
    p.add_argument("files", nargs="*",
                   help="pages to render or check (default: README.md and every page under docs/, where each table "
                        "must be marked once, and the plots' copies in docs/assets/)")
    args = p.parse_args(argv)
    files = args.files or [_path(page) for page in pages()]
    texts = {}  # the page's name (relative to the root where it is under it) -> its text
    for path in files:
        with open(path) as f:
            texts[os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path] = f.read()
    try:
        where = marked(texts)
        missing = [] if args.files else [name for name in TABLES if name not in where]
        if args.check:
            changed = [f"{name} ({page})" for page, text in texts.items() for name in stale(text)]
            plots = [] if args.files else [f"{ASSETS}/{plot}" for plot in stale_plots()]
            if changed or missing or plots:
                print("tables and plots that differ from their data (run `make docs-tables`): "
                      + ", ".join(changed + [f"{name} (marked in no page)" for name in missing] + plots),
                      file=sys.stderr)
                return 1
            return 0
        changed = []
        for page, text in texts.items():
            new, names_changed = rewrite(text)
            changed += names_changed
            if new != text:
                with open(_path(page), "w") as f:
                    f.write(new)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(where)} tables rendered in {len(texts)} pages; changed: {', '.join(changed) or 'none'}")
    if not args.files:
        print(f"{len(PLOTS)} plots in {ASSETS}; copied: {', '.join(copy_plots()) or 'none'}")
    if missing:
        print(f"error: no page marks: {', '.join(missing)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

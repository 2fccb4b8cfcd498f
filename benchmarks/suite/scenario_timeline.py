"""Where a test module's multi-run launch spends its wall time: runs one of its launches with each rank-0 progress line
("... rank 0: run i/n ...") printed with the seconds since the start, then the exit's time and the last line's.

    .venv/bin/python benchmarks/suite/scenario_timeline.py tests.distributed.test_pipeline \
        "module.run_scenarios('/tmp/pipeline_runs', 2, module.planned(2))"

The module's own launch code runs unchanged; only tests/subprocess_runner.execute (which the launch calls) is replaced
by one that streams the output. The second argument is Python evaluated with `module` bound to the test module.
"""

import importlib
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import subprocess_runner  # noqa: E402


def execute(cmd, timeout, merge_stderr=False, interrupt_when=None):  # noqa: ARG001  (execute's signature)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=subprocess_runner.ROOT, env=subprocess_runner.child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, last = [], start
    for line in proc.stdout:
        lines.append(line)
        last = time.monotonic()
        if "rank 0" in line and "run " in line:
            print(f"{last - start:7.1f} {line.strip()[:120]}", flush=True)
    proc.wait()
    print(f"{time.monotonic() - start:7.1f} exit {proc.returncode} (last line at {last - start:.1f})", flush=True)
    return proc.returncode, "".join(lines), ""


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    subprocess_runner.execute = execute
    module = importlib.import_module(sys.argv[1])
    if hasattr(module, "execute"):
        module.execute = execute
    eval(sys.argv[2], {"module": module})  # noqa: S307  (a developer's own command line)


if __name__ == "__main__":
    main()

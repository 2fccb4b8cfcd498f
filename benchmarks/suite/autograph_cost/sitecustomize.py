"""Counts what AutoGraph's conversions cost in every Python process that has this directory on PYTHONPATH.

    AUTOGRAPH_COST_DIR=/tmp/ag PYTHONPATH=benchmarks/suite/autograph_cost .venv/bin/python -m pytest -n 2 --dist loadgroup tests
    cat /tmp/ag/*.txt        # per process: CPU s in conversions, conversions, command line; then CPU s per module

Python imports sitecustomize at start-up (the subprocesses the tests start inherit PYTHONPATH). This one wraps
AutoGraph's PyToPy.transform_function when TensorFlow loads it, which every conversion passes through (cached or not),
and times it with the process's CPU clock. The file is rewritten after each conversion, so processes that leave by
os._exit are counted too. Nothing else changes; without AUTOGRAPH_COST_DIR it does nothing.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

_DIR = os.environ.get("AUTOGRAPH_COST_DIR")
_TARGET = "tensorflow.python.autograph.pyct.transpiler"
_total = [0.0, 0]
_per_module = {}


def _write():
    lines = [f"{_total[0]:.3f} {_total[1]} {' '.join(sys.argv)[:300]}\n"]
    lines += [f"  {s:.3f} {m}\n" for m, s in sorted(_per_module.items(), key=lambda kv: -kv[1])[:15]]
    with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "w") as fh:
        fh.writelines(lines)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ARG002
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            transform = module.PyToPy.transform_function

            def timed(self, fn, *args, **kwargs):
                began = time.process_time()
                try:
                    return transform(self, fn, *args, **kwargs)
                finally:
                    spent = time.process_time() - began
                    _total[0] += spent
                    _total[1] += 1
                    module_name = getattr(fn, "__module__", None) or "?"
                    _per_module[module_name] = _per_module.get(module_name, 0.0) + spent
                    _write()

            module.PyToPy.transform_function = timed

        spec.loader.exec_module = exec_module
        return spec


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    sys.meta_path.insert(0, _Finder())

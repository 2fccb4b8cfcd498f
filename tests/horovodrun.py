"""The suite's horovodrun: Horovod's own launcher (`horovod.runner.launch`, what `.venv/bin/horovodrun` runs), minus
one check it repeats on every launch.

Before starting the workers, horovodrun asks whether its extension was built with Gloo (or MPI) by forking a child that
imports TensorFlow and Horovod's op library: about 1.9 s of CPU and 1.6 s of wall per launch, paid again by every
one of the suite's horovodrun launches while both cores are busy. tests/conftest.py asks the same question once per
session (TF_FUSEDREC_REQUIRE_HOROVOD=1, as `make test` sets), and a Horovod without Gloo fails every worker's
`hvd.init()` anyway (the same for MPI); so here the launcher is told the answer. Everything else (host parsing, rendezvous, the
per-worker middlemen, output prefixes, terminating the survivors when a worker fails) is horovodrun's own code.
tests/apps/test_train_crash.py launches the stock `horovodrun` script, so the entry point users type stays tested.

    python tests/horovodrun.py -np 2 -H localhost:2 --gloo python -m tf_fusedrec.train ...
"""

import sys

from horovod.runner import launch


def _is_built(verbose=False):  # noqa: ARG001  (launch's signature)
    return True


launch.gloo_built = _is_built
launch.mpi_built = _is_built  # the same question for --mpi launches, asked once per session by tests/conftest.py

if __name__ == "__main__":
    sys.exit(launch.run_commandline())

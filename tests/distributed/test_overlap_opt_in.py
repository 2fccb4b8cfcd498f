"""Taking collectives out of program order (comm.overlap_collectives) is an explicit opt-in, checked in a fresh
interpreter since it is process-wide: importing tf_fusedrec and the meter, building a HorovodComm, a meter and a sync
TrainPipeline leave TensorFlow's order-insensitive op types as they were; a dbp TrainPipeline (or a direct call)
adds Horovod's collectives and tf.timestamp."""

import json
import sys

import pytest

from tests.subprocess_runner import execute, tail

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

CODE = """
import json
import horovod.tensorflow as hvd
from tensorflow.python.framework import auto_control_deps
import tf_fusedrec as fr
from tf_fusedrec.distributed import comm, meter
from tests.train.test_pipeline_api import data, make, mse

def skipped():
    return set(auto_control_deps.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS)

before = skipped()
hvd.init()
comm.HorovodComm()
meter.AlltoallMeter().wrap("single")
model, optimizer = make()
fr.train.TrainPipeline(model, optimizer, mse, data(2), schedule="sync").progress()
after_sync = skipped()
fr.train.TrainPipeline(model, optimizer, mse, data(2), schedule="dbp").progress()
print(json.dumps({"unchanged": after_sync == before, "added": sorted(skipped() - before),
                  "expected": sorted(comm.OVERLAPPED_OP_TYPES)}))
"""


def test_overlap_is_opt_in():
    rc, out, err = execute([sys.executable, "-c", CODE], 300)
    assert rc == 0, f"exit status {rc}\nstdout: {tail(out)}\nstderr: {tail(err)}"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["unchanged"], "importing, a HorovodComm, a meter or a sync pipeline changed TensorFlow's op ordering"
    assert result["added"] == result["expected"], result

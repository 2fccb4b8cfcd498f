"""Benchmarks. They print figures; tests never assert on time.

Every benchmark runs TensorFlow: it is imported here, before the benchmark modules import it, the way tf_fusedrec
imports it (tf_fusedrec/_frameworks.py: Keras 2 selected, the start-up chatter dropped).
"""

from tf_fusedrec import _frameworks

_frameworks.import_tensorflow()

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tf_fusedrec  # noqa: E402,F401  (selects Keras 2 before TensorFlow loads)
from tf_fusedrec.bench.train_bench import main  # noqa: E402

main()

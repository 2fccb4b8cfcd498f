# tf_fusedrec: `make test` installs what is missing, builds the op library both ways and runs every test.
PY := .venv/bin/python
BAZEL_LIB := bazel-bin/tf_fusedrec/ops/_fusedrec_ops.so
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install build bazel wheel test test-ops test-bazel bench-ops clean

install:
	scripts/install.sh

# The setup.py build, in place (the same compile `pip install --no-build-isolation .` runs).
build: install
	$(PY) setup.py -q build_ext --inplace

# The Bazel build of the same library, offline (see .bazelrc).
bazel: install
	bazel build --jobs=2 //...

# pip's route end to end: a wheel that carries the library.
wheel: install
	$(PY) -m pip wheel -q --no-build-isolation --no-deps . -w build/wheel
	$(PY) -c "import glob, zipfile, sys; names = zipfile.ZipFile(sorted(glob.glob('build/wheel/tf_fusedrec-*.whl'))[-1]).namelist(); sys.exit('tf_fusedrec/ops/_fusedrec_ops.so' not in names)"

test: build bazel
	$(PY) -m pytest tests
	TF_FUSEDREC_OPS_LIB=$(CURDIR)/$(BAZEL_LIB) $(PY) -m pytest tests/ops

test-ops: build
	$(PY) -m pytest tests/ops

bench-ops: build
	$(PY) -m tf_fusedrec.bench.ops

clean:
	rm -rf build tf_fusedrec/ops/_fusedrec_ops.so
	-bazel clean

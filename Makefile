# tf_fusedrec: `make test` installs what is missing, builds the op library both ways and runs every test.
PY := .venv/bin/python
BAZEL_LIB := bazel-bin/tf_fusedrec/ops/_fusedrec_ops.so
export TF_CPP_MIN_LOG_LEVEL ?= 2

HOROVODRUN := .venv/bin/horovodrun -np 2 -H localhost:2 --gloo
DEMO_STEPS ?= 100

.PHONY: install build bazel wheel demo test test-ops test-bazel bench bench-ops clean

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

# A short fused training of criteo_synthetic on 2 local workers, ending with its summary.
demo: build
	$(HOROVODRUN) $(PY) -m tf_fusedrec.train --config configs/criteo_synthetic.yaml --steps $(DEMO_STEPS) \
		--model-dir runs/demo-$$(date +%s)

test: build bazel
	$(PY) -m pytest tests
	TF_FUSEDREC_OPS_LIB=$(CURDIR)/$(BAZEL_LIB) $(PY) -m pytest tests/ops

test-ops: build
	$(PY) -m pytest tests/ops

bench-ops: build
	$(PY) -m tf_fusedrec.bench.ops

# The side-by-side benchmark the README's table comes from.
bench: build
	$(HOROVODRUN) $(PY) -m tf_fusedrec.bench --config configs/criteo_synthetic.yaml --out bench_results

clean:
	rm -rf build tf_fusedrec/ops/_fusedrec_ops.so
	-bazel clean

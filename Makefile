# tf_fusedrec: `make test` installs what is missing, builds the op library both ways and runs every test.
SHELL := /bin/bash
# Which tested stack (scripts/install.sh): baseline (.venv: TensorFlow 2.16.2 with the [tfra] extra, Keras 2) or
# current (.venv-current: TensorFlow 2.21, Keras 3, NumPy 2, no TFRA). `make test STACK=current` runs the suite there.
STACK ?= baseline
ifeq ($(STACK),current)
VENV := .venv-current
else ifeq ($(STACK),baseline)
VENV := .venv
# The baseline stack is the TFRA one, and TFRA needs Keras 2: its programs run with tf.keras = tf_keras (tf_fusedrec
# itself never chooses; a caller's own setting wins).
export TF_USE_LEGACY_KERAS ?= 1
else
$(error STACK must be baseline or current, got '$(STACK)')
endif
PY := $(VENV)/bin/python
BAZEL_LIB := bazel-bin/tf_fusedrec/ops/_fusedrec_ops.so
export TF_CPP_MIN_LOG_LEVEL ?= 2

HOROVODRUN := $(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo
# Each local worker on a core of its own (scripts/pin_worker.sh): measured faster on this 2-core machine
# (docs/development/journal.md, "Table backends and pinning").
PINNED_HOROVODRUN := $(HOROVODRUN) scripts/pin_worker.sh
# Local workers over Open MPI (horovodrun --mpi: shared memory between the ranks), pinned: the demo and the bench.
# 1.49-1.78x Gloo's loopback for `fused` here (docs/development/journal.md, "Gloo against MPI"). mpirun refuses to
# start as root unless told that it is meant: the two variables (nothing for other users). The cluster bench keeps
# Gloo, as its hosts use.
MPI_ROOT_ENV := $(if $(filter 0,$(shell id -u)),env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
LOCAL_HOROVODRUN := $(MPI_ROOT_ENV) $(VENV)/bin/horovodrun -np 2 -H localhost:2 --mpi scripts/pin_worker.sh
DEMO_STEPS ?= 100
# The Bazel build of the op library (make bazel, and make test beside the suite). Its sandboxes go to /dev/shm when
# it is writable with a GiB free (a tmpfs on Linux): each compile action links all ~20,000 of TensorFlow's headers into its sandbox, and
# on disk that cost 321 s of CPU (170 s in the kernel) for a build that takes 168 s on tmpfs (benchmarks/results/tests/bazel_sandbox.txt).
BAZEL_SANDBOX := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1)" -ge 1048576 ] 2>/dev/null && echo --sandbox_base=/dev/shm)
BAZEL_BUILD := bazel build --jobs=2 $(BAZEL_SANDBOX) //...

.PHONY: install build bazel wheel demo test test-fast test-ops test-bazel bench bench-ops bench-cluster bench-cluster-runs bench-serve \
	docs docs-tables docs-reference cuda-harness cuda-check cuda-bench clean

install:
	FUSEDREC_STACK=$(STACK) scripts/install.sh

# The setup.py build, in place (the same compile `pip install --no-build-isolation .` runs): scripts/install.sh runs
# it (`setup.py build_ext --inplace`, which recompiles only what changed), so a second call here would only import
# TensorFlow again.
build: install

# The Bazel build of the same library, offline (see .bazelrc).
bazel: install
	$(BAZEL_BUILD)

# pip's route end to end: a wheel that carries the library.
wheel: install
	$(PY) -m pip wheel -q --no-build-isolation --no-deps . -w build/wheel
	$(PY) -c "import glob, zipfile, sys; names = zipfile.ZipFile(sorted(glob.glob('build/wheel/tf_fusedrec-*.whl'))[-1]).namelist(); sys.exit('tf_fusedrec/ops/_fusedrec_ops.so' not in names)"

# A short fused training of criteo_synthetic on 2 local workers: rank 0's progress line (in place on a terminal) and
# short summary, on stdout, without mpirun's tags (rank 0 writes to the launcher's own stdout: train/progress.py).
# horovodrun's check that Horovod has MPI imports TensorFlow in a child of its own, which logs three harmless ERROR
# lines about CUDA plugin factories registered twice (the workers drop them on import, tf_fusedrec/_frameworks.py):
# filtered out of stderr here, so that stdout stays the terminal; every other line, and the exit status, pass through.
TF_PLUGIN_NOISE := Unable to register cu(FFT|DNN|BLAS) factory: Attempting to register factory
demo: build
	$(LOCAL_HOROVODRUN) $(PY) -m tf_fusedrec.train --config configs/criteo_synthetic.yaml --steps $(DEMO_STEPS) \
		--model-dir runs/demo-$$(date +%s) 2> >(grep --line-buffered -v -E '$(TF_PLUGIN_NOISE)' >&2); \
	status=$$?; wait $$!; exit $$status

# Two pytest-xdist workers: the suite's processes wait on each other (Horovod's cycles, servers, rendezvous) about
# half the time, so two at once fill both cores. tests/conftest.py keeps on one worker the tests of a module that
# share a module's cached runs (horovodrun scenarios, bench and training runs), so those run once; other tests are
# spread one by one (pytest is pinned to 8.4.2: with pytest 9 pytest-xdist 3.8 groups nothing).
PYTEST_PARALLEL := -n 2 --dist loadgroup
# What the current stack's lane runs: the whole suite, but for the protobuf code check (the committed generated code
# is checked in the baseline lane: grpcio-tools 1.62, which generated it, needs protobuf 4, the current stack has 5);
# the tests that need TFRA (marked `tfra`) are skipped there and counted in the summary.
CURRENT_TESTS ?= tests --deselect tests/serve/test_embedding_server.py::test_generated_code_matches_the_proto

# The whole suite against the setup.py build (printing its 30 slowest setups and calls, so a slow run, CI's included,
# names its slow tests), then the op tests against the Bazel build. Bazel builds meanwhile, at the lowest CPU priority
# (nice 19, inherited by the Bazel server a new workspace starts and its compilers): it takes the cores when the suite's
# processes wait on each other (a tenth of the suite's time), not from the tests. A failed Bazel build fails the
# target, after the suite, with its log's tail (the whole log: build/bazel-build.log).
ifeq ($(STACK),baseline)
test: build
	@mkdir -p build; \
	nice -n 19 $(BAZEL_BUILD) >build/bazel-build.log 2>&1 & bazel_pid=$$!; \
	TF_FUSEDREC_REQUIRE_HOROVOD=1 TF_FUSEDREC_REQUIRE_TFRA=1 $(PY) -m pytest $(PYTEST_PARALLEL) --durations=30 tests; \
	suite=$$?; \
	if ! wait $$bazel_pid; then \
	  echo "make test: the Bazel build failed (build/bazel-build.log):"; tail -n 40 build/bazel-build.log; exit 1; \
	fi; \
	echo "make test: the Bazel build is done (build/bazel-build.log)"; \
	test $$suite -eq 0 || exit $$suite; \
	TF_FUSEDREC_OPS_LIB=$(CURDIR)/$(BAZEL_LIB) $(PY) -m pytest $(PYTEST_PARALLEL) tests/ops
else
# The current stack: the suite against the setup.py build (Bazel's is checked in the baseline lane). Tests marked
# `tfra` are skipped, and counted in the summary, since this stack has no TFRA.
test: build
	TF_FUSEDREC_REQUIRE_HOROVOD=1 $(PY) -m pytest $(PYTEST_PARALLEL) --durations=30 $(CURRENT_TESTS)
endif

# The fast tier: in-process unit and oracle tests only (no horovodrun, servers, clusters or nvcc; tests/conftest.py
# marks the rest `slow`), a few minutes.
test-fast: build
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow" tests

test-ops: build
	$(PY) -m pytest tests/ops

bench-ops: build
	$(PY) -m tf_fusedrec.bench.ops

# The side-by-side benchmark the training benchmark's tables come from (docs/benchmarks/training.md).
bench: build
	$(LOCAL_HOROVODRUN) $(PY) -m tf_fusedrec.bench --config configs/criteo_synthetic.yaml --out bench_results

# Serving: 2 embedding servers and a ranker on loopback, pooling x cache, at a low and a high load, then the saturation
# curve of pooling + cache over 7 offered rates (benchmarks/results/serve: serve_bench.{json,md}, serve_curve.{json,png}); about
# 3.5 minutes on 2 cores.
# BENCH_SERVE_ARGS="--curve-qps ''" skips the curve.
BENCH_SERVE_ARGS ?=
bench-serve: build
	$(PY) -m tf_fusedrec.serve.bench --out benchmarks/results/serve $(BENCH_SERVE_ARGS)

# The same benchmark on a cluster of namespaced hosts with shaped links (needs root; see tf_fusedrec/cluster), with
# the link cost probe beside each run, then the cost model checked against the runs and projected to N = 8..128.
# Runs: 2 hosts at 1 and 10 Gbit; 1 worker on 1 core (the model's compute term); 2 hosts x 2 workers at 1 Gbit;
# 2 workers on loopback (horovodrun), under the same load as the others. About 9 minutes on 2 cores (9 min 18 s on
# 2026-11-27: docs/benchmarks/cluster.md).
CLUSTER := $(PY) -m tf_fusedrec.cluster
CLUSTER_OUT ?= bench_results/cluster
BENCH_CLUSTER_ARGS ?= --config configs/criteo_synthetic.yaml --repeats 3 --sweep ''
# Every worker of the cluster benchmark has a core of its own, as on separate machines: horovodrun's worker r runs
# under `taskset -c r` (the cluster launcher's --cores-per-worker 1 does the same on namespaced hosts).
bench-cluster-runs: build
	$(PINNED_HOROVODRUN) $(PY) -m tf_fusedrec.cluster.probe --out $(CLUSTER_OUT)/loopback-n2
	$(PINNED_HOROVODRUN) $(PY) -m tf_fusedrec.bench $(BENCH_CLUSTER_ARGS) --out $(CLUSTER_OUT)/loopback-n2
	for rate in 100mbit 300mbit 1gbit 10gbit; do \
		$(CLUSTER) --hosts 2 --cores-per-worker 1 --link-rate $$rate -- $(PY) -m tf_fusedrec.cluster.probe \
			--out $(CLUSTER_OUT)/$$rate-n2 && \
		$(CLUSTER) --hosts 2 --cores-per-worker 1 --link-rate $$rate -- $(PY) -m tf_fusedrec.bench $(BENCH_CLUSTER_ARGS) \
			--out $(CLUSTER_OUT)/$$rate-n2 || exit 1; \
	done
	taskset -c 0 $(PY) -m tf_fusedrec.bench $(BENCH_CLUSTER_ARGS) --out $(CLUSTER_OUT)/n1-1core

bench-cluster: bench-cluster-runs
	$(PY) -m tf_fusedrec.cluster.model --runs $(CLUSTER_OUT) --out $(CLUSTER_OUT)

# The result tables of the README and the docs pages, rewritten in place from the committed result files under
# benchmarks/results/, and the plots the pages show copied into docs/assets/ (standard library only;
# tests/test_docs_tables.py checks every table against a fresh rendering).
docs-tables:
	$(PY) scripts/docs_tables.py

# The reference pages of the command lines and of the config (docs/reference/cli.md, config.md), rewritten from the
# commands' argparse parsers and the config dataclasses and their comments (about 10 s: it imports the commands'
# modules; tests/test_docs_reference.py checks the pages against a fresh rendering). Run it after changing a flag or
# a config key.
docs-reference:
	$(PY) scripts/docs_reference.py

# The docs site (docs/development/docs.md) into build/site: MkDocs, strict (a broken link or anchor, a page missing
# from the nav, an unresolved API entry fail it). Its tools are pinned in requirements-docs.txt and installed into
# .venv-docs, again when that file changes (a stamp of its hash, as scripts/install.sh keeps for .venv); no TensorFlow
# (mkdocstrings reads the source). NO_MKDOCS_2_WARNING: the theme's notice about its end of life, on every build.
DOCS_VENV := .venv-docs
DOCS_PYTHON ?= python3.11
docs:
	@stamp=$(DOCS_VENV)/.requirements-docs; want=$$(sha256sum requirements-docs.txt | cut -c1-16); \
	if [ "$$(cat $$stamp 2>/dev/null)" != "$$want" ]; then \
	  echo "make docs: installing requirements-docs.txt into $(DOCS_VENV)"; \
	  { [ -x $(DOCS_VENV)/bin/python ] || $(DOCS_PYTHON) -m venv $(DOCS_VENV); } && \
	  $(DOCS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-docs.txt && \
	  echo "$$want" >$$stamp || exit 1; \
	fi
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --quiet -d build/site
	@echo "make docs: build/site/index.html"

# The CUDA kernels' standalone harness (tests/cuda/README.md). nvcc from PATH, else $$CUDA_HOME/bin; one arch
# (sm_90 code + compute_90 PTX) keeps the compile under a minute; CUDA_GENCODE overrides it.
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,nvcc))
CUDA_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_HARNESS := build/cuda/harness
CUDA_HARNESS_SRCS := tests/cuda/harness.cu cc/kernels/impl/fusedrec_gpu.cu.cc
CUDA_HARNESS_DEPS := $(CUDA_HARNESS_SRCS) cc/kernels/impl/fusedrec_gpu.h cc/kernels/impl/fusedrec_gpu.cu.h \
	cc/kernels/impl/hashing.h

cuda-harness: $(CUDA_HARNESS)

$(CUDA_HARNESS): $(CUDA_HARNESS_DEPS)
	@command -v $(NVCC) >/dev/null || { echo "cuda-harness: nvcc not found on PATH or in \$$CUDA_HOME/bin" >&2; exit 1; }
	mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -I. $(CUDA_GENCODE) tests/cuda/harness.cu -x cu cc/kernels/impl/fusedrec_gpu.cu.cc -o $@

# Compiles the harness, writes the oracle's cases, and runs them where a CUDA device is present. Without one it
# runs only the host checks, says the kernels did not run, and succeeds (so CI can call it).
cuda-check: $(CUDA_HARNESS)
	PYTHONPATH=$(CURDIR) $(PY) tests/cuda/write_cases.py build/cuda/cases
	@$(CUDA_HARNESS) build/cuda/cases; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "cuda-check: harness compiled and host-checked; kernels NOT run (no CUDA device)"; \
	elif [ $$rc -ne 0 ]; then echo "cuda-check: FAILED (exit $$rc)" >&2; exit $$rc; \
	else echo "cuda-check: kernels ran and equal the oracle"; fi

# Correctness cases plus the 26 x 4096 Zipf group of bench.ops, and 26 x 4096 / 65536 / 393216 (10.2M keys) groups
# the harness generates, timed against sort + unique_by_key. Needs a GPU (tests/cuda/device_check.sh: a GPU machine
# without TensorFlow).
CUDA_BENCH_SYNTHETIC ?= 4096,65536,393216
cuda-bench: $(CUDA_HARNESS)
	PYTHONPATH=$(CURDIR) $(PY) tests/cuda/write_cases.py build/cuda/bench_cases --bench
	$(CUDA_HARNESS) build/cuda/bench_cases --bench --bench-synthetic $(CUDA_BENCH_SYNTHETIC)

clean:
	rm -rf build tf_fusedrec/ops/_fusedrec_ops.so
	-bazel clean

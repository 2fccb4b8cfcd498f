#!/usr/bin/env bash
# Installs everything tf_fusedrec needs, from nothing: the system tools (Bazel, cmake), a virtual environment with one
# of the two tested stacks, Horovod built from source with Gloo and MPI, and tf_fusedrec itself (editable). Re-running
# it when all is installed takes seconds: each step is skipped when its result is already there and its inputs have not
# changed.
#
# FUSEDREC_STACK picks the stack (README, "Compatibility"):
#   baseline (default): .venv from requirements.txt: TensorFlow 2.16.2, tf-keras, TFRA 0.8.1 (the [tfra] extra).
#   current:            .venv-current from requirements-current.txt: TensorFlow 2.21 (tensorflow-cpu), Keras 3,
#                       NumPy 2, no TFRA; Horovod 0.28.1 with scripts/horovod/'s patch (it does not build there as
#                       released).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
HOROVOD_VERSION=0.28.1
STACK=${FUSEDREC_STACK:-baseline}
case "$STACK" in
  baseline) VENV=.venv REQUIREMENTS=requirements.txt ;;
  current) VENV=.venv-current REQUIREMENTS=requirements-current.txt ;;
  *) echo "[install] FUSEDREC_STACK must be baseline or current, got '$STACK'" >&2; exit 1 ;;
esac
log() { echo "[install] $SECONDS s: $*"; }  # seconds since the start: a slow install names its slow step

need_apt=()
command -v bazel >/dev/null || need_apt+=(bazel-bootstrap)
[ -d /usr/share/bazel/rules/java ] || need_apt+=(bazel-rules-java)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
command -v patch >/dev/null || need_apt+=(patch)  # Horovod's patch for TensorFlow >= 2.19 (build_horovod)
# Open MPI: Horovod is built with it beside Gloo. Local workers launched with `horovodrun --mpi` exchange their
# all-to-alls through shared memory instead of Gloo's TCP loopback (README, "Gloo against MPI").
{ command -v mpirun && command -v mpicxx; } >/dev/null || need_apt+=(openmpi-bin libopenmpi-dev)
# ip and tc build the namespaced cluster of tf_fusedrec.cluster (its tests and make bench-cluster).
{ command -v ip && command -v tc; } >/dev/null || need_apt+=(iproute2)
# openssl makes the test certificates of the TLS tests (tests/serve/test_tls.py) and the serving-security guide.
command -v openssl >/dev/null || need_apt+=(openssl)
# RocksDB's shared library: the store of tiered tables (tables larger than memory), loaded by the op library when one
# is created (cc/kernels/impl/disk_store.h); tests/ops/test_native_table_tiered.py and the tiered tests need it.
ldconfig -p | grep -q 'librocksdb\.so' || need_apt+=(librocksdb-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "[install] missing system packages: ${need_apt[*]}; run as root or apt-get install them" >&2
    exit 1
  fi
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV"/bin/python ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV"/bin/python -m pip --disable-pip-version-check)

stamp=$VENV/.fusedrec-requirements
want=$(sha256sum "$REQUIREMENTS" | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing the pinned $STACK stack ($REQUIREMENTS)"
  "${PIP[@]}" install -q --upgrade pip wheel
  # A .venv made when requirements.txt also named tensorflow-cpu holds two TensorFlow distributions in the same
  # files: remove that one and lay tensorflow's files down again (requirements.txt says why tensorflow).
  if [ "$STACK" = baseline ] && "${PIP[@]}" show -q tensorflow-cpu >/dev/null 2>&1; then
    log "removing tensorflow-cpu, installed beside tensorflow (one TensorFlow distribution)"
    "${PIP[@]}" uninstall -q -y tensorflow-cpu
    "${PIP[@]}" install -q --force-reinstall --no-deps "$(grep -E '^tensorflow==' requirements.txt)"
  fi
  "${PIP[@]}" install -q -r "$REQUIREMENTS"
  echo "$want" >"$stamp"
fi

# Builds Horovod $HOROVOD_VERSION from its PyPI sdist into the environment of the Python named by $1, with
# TensorFlow, Gloo and MPI. TensorFlow 2.19 and later need scripts/horovod/horovod-0.28.1-tf2.19.patch: stock
# 0.28.1 fails to compile against them (scripts/horovod/README.md: it builds as released against 2.16 to 2.18).
# scripts/horovod_cmake.sh: Horovod's optimised build without debug information (140 s against 169 s here).
build_horovod() {
  local py=$1 src tf
  src=$(mktemp -d "${TMPDIR:-/tmp}/horovod-src.XXXXXX")
  "$py" -m pip --disable-pip-version-check download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$src"
  tar xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
  # The installed TensorFlow's version, from its distribution's metadata (no TensorFlow import): tensorflow or
  # tensorflow-cpu, whichever is there.
  tf=$("$py" -c "import importlib.metadata as m
for d in 'tensorflow', 'tensorflow-cpu':
    try: print(m.version(d)); break
    except m.PackageNotFoundError: pass")
  [ -n "$tf" ] || { echo "[install] no TensorFlow in $py's environment to build Horovod against" >&2; return 1; }
  if "$py" -c "import sys; sys.exit(tuple(map(int, '$tf'.split('.')[:2])) < (2, 19))"; then
    log "patching horovod $HOROVOD_VERSION for TensorFlow $tf (scripts/horovod/horovod-0.28.1-tf2.19.patch)"
    patch -s -p1 -d "$src/horovod-$HOROVOD_VERSION" <scripts/horovod/horovod-0.28.1-tf2.19.patch
  fi
  HOROVOD_CMAKE="$(pwd)/scripts/horovod_cmake.sh" \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 "$py" -m pip --disable-pip-version-check install -q --no-build-isolation --no-cache-dir \
    "$src/horovod-$HOROVOD_VERSION"
  rm -rf "$src"
}

# One interpreter checks that Horovod is the pinned version and loads with TensorFlow, and says both versions for the
# last line: each TensorFlow import costs 3-4 s of CPU, and `make test` runs this script again after `make wheel`.
versions() {
  "$VENV"/bin/python -c "import sys, horovod, horovod.tensorflow as hvd, tensorflow as tf
if horovod.__version__ != '$HOROVOD_VERSION' or not (hvd.gloo_built() and hvd.mpi_built()): sys.exit(1)
print('tensorflow', tf.__version__, 'horovod', horovod.__version__, 'with Gloo and MPI')" 2>/dev/null
}
if ! ok=$(versions); then
  ok=
  if "${PIP[@]}" show -q horovod >/dev/null 2>&1; then
    log "removing the installed horovod (not $HOROVOD_VERSION with Gloo and MPI)"
    "${PIP[@]}" uninstall -q -y horovod
  fi
  log "building horovod $HOROVOD_VERSION with TensorFlow, Gloo and MPI (about 2.5-5 minutes on 2 cores)"
  build_horovod "$VENV"/bin/python
fi
# tf_fusedrec itself, editable, into $VENV: `$VENV/bin/python my_script.py` imports it from any directory, and edits
# to this checkout take effect without reinstalling. The op library is built in place first, so the editable install
# finds it up to date. Skipped when $VENV already imports tf_fusedrec from this checkout.
"$VENV"/bin/python setup.py -q build_ext --inplace
here=$(pwd -P)/tf_fusedrec
if ! (cd / && "$here/../$VENV/bin/python" -c "import importlib.util as u, os, sys; s = u.find_spec('tf_fusedrec')
sys.exit(s is None or os.path.realpath(list(s.submodule_search_locations)[0]) != sys.argv[1])" "$here"); then
  log "installing tf_fusedrec into $VENV (editable)"
  "${PIP[@]}" install -q --no-build-isolation --no-deps -e .
fi
[ -n "$ok" ] || ok=$(versions) || { echo "[install] Horovod $HOROVOD_VERSION does not load with TensorFlow after its build" >&2; exit 1; }
log "ok: $ok"

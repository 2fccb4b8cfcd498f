"""Builds tf_fusedrec and its op library with the compile and link flags of the installed TensorFlow.

`pip install --no-build-isolation .` (TensorFlow must already be installed: the library is compiled against it)
or, in a checkout, `python setup.py build_ext --inplace` (what `make build` runs).
"""

import concurrent.futures
import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

LIB_NAME = "tf_fusedrec.ops._fusedrec_ops"
# Where every build of the library keeps its objects (see TFBuildExt.build_extension).
OBJECT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", "objects")
SOURCES = sorted(glob.glob("cc/ops/*.cc") + glob.glob("cc/kernels/*.cc"))
HEADERS = sorted(glob.glob("cc/kernels/*.h") + glob.glob("cc/kernels/impl/*.h"))
# TF-free CUDA kernels, compiled by nvcc only when TensorFlow is built with CUDA (see cuda_build).
CUDA_SOURCES = sorted(glob.glob("cc/kernels/impl/*.cu.cc"))
# $TF_FUSEDREC_CUDA: "auto" (default: CUDA kernels iff TensorFlow is built with CUDA and nvcc is found), "1" (required:
# fail if nvcc is missing), "0" (CPU kernels only). $TF_FUSEDREC_CUDA_ARCHS: compute capabilities for nvcc.
CUDA_ENV = "TF_FUSEDREC_CUDA"
CUDA_ARCHS_ENV = "TF_FUSEDREC_CUDA_ARCHS"
DEFAULT_CUDA_ARCHS = "75;80;90"


def find_nvcc():
    """nvcc from PATH, else $CUDA_HOME/bin/nvcc, else None."""
    found = shutil.which("nvcc")
    if found is None and os.environ.get("CUDA_HOME"):
        candidate = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        found = candidate if os.access(candidate, os.X_OK) else None
    return found


def cuda_lib_dir(nvcc):
    """The CUDA toolkit's library directory, as nvcc itself reports its install root (nvcc may be a wrapper)."""
    dry = subprocess.run([nvcc, "--dryrun", "-c", "x.cu"], capture_output=True, text=True)
    match = re.search(r"TOP=(\S+)", dry.stdout + dry.stderr)
    top = match.group(1) if match else os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    for lib in ("lib64", os.path.join("targets", "x86_64-linux", "lib")):
        if os.path.exists(os.path.join(top, lib, "libcudart_static.a")):
            return os.path.normpath(os.path.join(top, lib))
    raise RuntimeError(f"libcudart_static.a not found under {top} (the CUDA toolkit of {nvcc})")


def cuda_build(tf):
    """Returns (nvcc or None, reason): whether to compile the CUDA kernels, and why (printed by the build)."""
    mode = os.environ.get(CUDA_ENV, "auto")
    if mode not in ("auto", "0", "1"):
        raise RuntimeError(f"{CUDA_ENV} must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return None, f"disabled by {CUDA_ENV}=0"
    nvcc = find_nvcc()
    built_with_cuda = tf.test.is_built_with_cuda()
    if mode == "1":
        if nvcc is None:
            raise RuntimeError(f"{CUDA_ENV}=1 but nvcc is neither on PATH nor in $CUDA_HOME/bin")
        why = "TensorFlow is built with CUDA" if built_with_cuda else f"forced by {CUDA_ENV}=1"
        return nvcc, f"{why}, nvcc {nvcc}"
    if not built_with_cuda:
        return None, f"TensorFlow {tf.__version__} is not built with CUDA"
    if nvcc is None:
        return None, "TensorFlow is built with CUDA but nvcc is neither on PATH nor in $CUDA_HOME/bin"
    return nvcc, f"TensorFlow is built with CUDA (CUDA {tf.sysconfig.get_build_info().get('cuda_version')}), nvcc {nvcc}"


def cuda_commands(nvcc, tf_flags, build_dir):
    """The nvcc commands that compile the TF-free CUDA sources ((command, object) pairs) and the link flags of the CUDA
    runtime."""
    archs = [a.strip() for a in os.environ.get(CUDA_ARCHS_ENV, DEFAULT_CUDA_ARCHS).split(";") if a.strip()]
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")  # PTX for newer GPUs
    defines = [f for f in tf_flags if f.startswith("-D")]  # the ABI macro must match the g++ side
    commands = []
    for src in CUDA_SOURCES:
        obj = os.path.join(build_dir, os.path.basename(src).replace(".cu.cc", ".cu.o"))
        cmd = [nvcc, "-c", "-x", "cu", "-std=c++17", "-O3", "-I.", "-Xcompiler", "-fPIC"] + defines + gencode
        commands.append((cmd + [src, "-o", obj], obj))
    # The static runtime, kept private (--exclude-libs): the library does not depend on where libcudart.so is
    # installed, and its kernels register with its own runtime, not with the libcudart TensorFlow loaded.
    return commands, [f"-L{cuda_lib_dir(nvcc)}", "-lcudart_static", "-ldl", "-lrt", "-lpthread",
                      "-Wl,--exclude-libs,libcudart_static.a"]


def up_to_date(obj, record, newest_input):
    """Whether obj was made by the compile that `record` describes (the command and the TensorFlow version whose
    headers it read, written beside the object in obj + ".cmd") no earlier than `newest_input` (the mtime of the
    newest source or header)."""
    try:
        with open(obj + ".cmd") as f:
            recorded = f.read()
        made = os.path.getmtime(obj)
    except OSError:
        return False
    return recorded == record and made >= newest_input


def run_all(commands, stamp, newest_input=None):
    """Runs the compile commands ((command, object) pairs), as many at once as there are cores: one compiler call
    per translation unit, nvcc's beside g++'s, instead of one after another; returns the objects in order. With
    `newest_input` (the newest source's or header's mtime; None compiles everything, as --force asks), a command
    whose object is up to date (up_to_date: same command and `stamp`, the TensorFlow version) is not run again."""

    def one(command):
        cmd, obj = command
        record = "\0".join(cmd + [stamp])
        if newest_input is not None and up_to_date(obj, record, newest_input):
            print(f"{obj}: up to date", file=sys.stderr)
            return obj
        print(" ".join(cmd), file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            os.remove(obj + ".cmd")
        subprocess.check_call(cmd)
        with open(obj + ".cmd", "w") as f:
            f.write(record)
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, commands))


def library_built_against(path):
    """The TensorFlow version recorded in a built op library: tf_fusedrec/ops/_loader.py's built_against, that module
    loaded from the source tree by its path (importing the package's ops would load the library itself)."""
    import importlib.util  # noqa: PLC0415

    loader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_fusedrec", "ops", "_loader.py")
    spec = importlib.util.spec_from_file_location("_fusedrec_build_loader", loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.built_against(path)


# The TensorFlow versions tf_fusedrec supports and tests (DESIGN.md: 2.16 to 2.21, tested at both ends).
SUPPORTED_TF = ">=2.16,<2.22"


def check_supported(version):
    """Refuses to build against a TensorFlow outside SUPPORTED_TF, naming it."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if not (2, 16) <= (major, minor) < (2, 22):
        raise RuntimeError(f"tf_fusedrec supports TensorFlow {SUPPORTED_TF}; the installed one is {version}")


class TFBuildExt(build_ext):
    """Compiles the op library with g++ and tf.sysconfig flags instead of the Python extension toolchain."""

    def build_extension(self, ext):
        try:
            import tensorflow as tf
        except ImportError as e:
            raise RuntimeError(
                f"tf_fusedrec compiles against the installed TensorFlow: install tensorflow-cpu{SUPPORTED_TF} (or "
                f"tensorflow) first and build with `pip install --no-build-isolation .`"
            ) from e
        check_supported(tf.__version__)
        out = self.get_ext_fullpath(ext.name)
        # Python's EXT_SUFFIX would give _fusedrec_ops.cpython-311-...so; the loader looks for the plain name.
        out = os.path.join(os.path.dirname(out), "_fusedrec_ops.so")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        newest = max(os.path.getmtime(p) for p in ext.sources + ext.depends)
        # Up to date: newer than every source and built against this TensorFlow (its marker, cc/kernels/build_info.cc).
        # The marker matters where one checkout serves two stacks (make test, then make test STACK=current): the
        # library is then newer than its sources but for the other TensorFlow.
        if (not self.force and os.path.exists(out) and os.path.getmtime(out) >= newest
                and library_built_against(out) == tf.__version__):
            return
        nvcc, reason = cuda_build(tf)
        print(f"tf_fusedrec: CUDA kernels {'built' if nvcc else 'skipped'}: {reason}", file=sys.stderr)
        # The objects go to one directory of the source tree, whatever build_temp this build was given: `pip install
        # -e .` builds in a temporary directory of its own, and after scripts/install.sh's in-place build it compiled
        # the whole library again (49 s of a fresh clone's CI); run_all links the objects an identical compile made.
        build_dir = OBJECT_DIR
        os.makedirs(build_dir, exist_ok=True)
        commands, cuda_flags, cuda_libs = [], [], []
        if nvcc:
            commands, cuda_libs = cuda_commands(nvcc, tf.sysconfig.get_compile_flags(), build_dir)
            cuda_flags = ["-DGOOGLE_CUDA=1"]
        cxx = os.environ.get("CXX", "g++")
        # -ffp-contract=off: no fused multiply-adds even where CXXFLAGS allow FMA, so the table's optimizer updates
        # round each product and sum as TensorFlow's CPU kernels and the NumPy references do.
        # FUSEDREC_TF_VERSION: the TensorFlow built against, recorded in the library (cc/kernels/build_info.cc).
        flags = (["-fPIC", "-O3", "-ffp-contract=off", "-Wall", "-I.", f'-DFUSEDREC_TF_VERSION="{tf.__version__}"']
                 + tf.sysconfig.get_compile_flags() + cuda_flags)
        for src in ext.sources:
            obj = os.path.join(build_dir, os.path.basename(src).replace(".cc", ".o"))
            commands.append(([cxx, "-c"] + flags + [src, "-o", obj], obj))
        objects = run_all(commands, f"tensorflow {tf.__version__}", None if self.force else newest)
        # -ldl: dlopen of RocksDB by tiered tables (cc/kernels/impl/disk_store.h); part of libc from glibc 2.34.
        cmd = [cxx, "-shared"] + objects + ["-o", out] + tf.sysconfig.get_link_flags() + cuda_libs + ["-ldl"]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.check_call(cmd)

    def copy_extensions_to_source(self):
        # --inplace: setuptools copies the library it built into the source tree only when it is newer than the one
        # there, which may be a newer build for another TensorFlow (`pip install -e .` of another stack builds in a
        # directory of its own and puts its library there): always copied, so the tree holds this TensorFlow's.
        force, self.force = self.force, True
        try:
            super().copy_extensions_to_source()
        finally:
            self.force = force

    def copy_file(self, infile, outfile, *args, **kwargs):
        # Into the tree through a new file renamed over the old: a process that has the old library loaded (a test
        # or a training run) keeps its mapping, where copying over it in place changes the pages under that process.
        if not str(outfile).endswith("_fusedrec_ops.so"):
            return super().copy_file(infile, outfile, *args, **kwargs)
        tmp = f"{outfile}.tmp{os.getpid()}"
        shutil.copy2(infile, tmp)
        os.replace(tmp, outfile)
        return outfile, 1

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")[:-1], "_fusedrec_ops.so")


setup(
    name="tf_fusedrec",
    version="0.1.0",
    description="Fused, lossless embedding communication for recommendation training on TensorFlow + Horovod",
    packages=find_packages(include=["tf_fusedrec", "tf_fusedrec.*"]),
    ext_modules=[Extension(LIB_NAME, sources=SOURCES, depends=HEADERS + CUDA_SOURCES)],
    cmdclass={"build_ext": TFBuildExt},
    python_requires=">=3.9",
    # TensorFlow itself is not named here: it comes as `tensorflow` or `tensorflow-cpu` (pip cannot say "either"), and
    # the op library is compiled against the one installed (the build refuses one outside SUPPORTED_TF). The extras
    # name one: [cpu] or [gpu]; [tfra] is the TFRA stack (the per-feature baseline, table_backend="tfra", Keras 2).
    # tensorboard: tf.summary (TF >= 2.20 lacks it); pyarrow: the parquet and csv sources (tf_fusedrec/data/readers.py)
    install_requires=["numpy", "pyyaml", "orjson", "tensorboard", "pyarrow>=17"],
    extras_require={
        "cpu": [f"tensorflow-cpu{SUPPORTED_TF}"],
        "gpu": [f"tensorflow{SUPPORTED_TF}"],
        # TFRA 0.8.1 (its last release) declares tensorflow<=2.16.2 and needs Keras 2 (tf-keras); its kernels call
        # the CUDA runtime that only the `tensorflow` wheel's libtensorflow_framework carries (requirements.txt).
        "tfra": ["tensorflow==2.16.2", "tf-keras==2.16.0", "tensorflow-recommenders-addons==0.8.1", "numpy<2",
                 "setuptools<81"],
    },
    zip_safe=False,
)

"""Builds tf_fusedrec and its op library with the compile and link flags of the installed TensorFlow.

`pip install --no-build-isolation .` (TensorFlow must already be installed: the library is compiled against it)
or, in a checkout, `python setup.py build_ext --inplace` (what `make build` runs).
"""

import glob
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

LIB_NAME = "tf_fusedrec.ops._fusedrec_ops"
SOURCES = sorted(glob.glob("cc/ops/*.cc") + glob.glob("cc/kernels/*.cc"))
HEADERS = sorted(glob.glob("cc/kernels/*.h") + glob.glob("cc/kernels/impl/*.h"))


class TFBuildExt(build_ext):
    """Compiles the op library with g++ and tf.sysconfig flags instead of the Python extension toolchain."""

    def build_extension(self, ext):
        try:
            import tensorflow as tf
        except ImportError as e:
            raise RuntimeError(
                "tf_fusedrec compiles against the installed TensorFlow: install tensorflow-cpu==2.16.2 first and "
                "build with `pip install --no-build-isolation .`"
            ) from e
        out = self.get_ext_fullpath(ext.name)
        # Python's EXT_SUFFIX would give _fusedrec_ops.cpython-311-...so; the loader looks for the plain name.
        out = os.path.join(os.path.dirname(out), "_fusedrec_ops.so")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if not self.force and os.path.exists(out):
            newest = max(os.path.getmtime(p) for p in ext.sources + ext.depends)
            if os.path.getmtime(out) >= newest:
                return
        cxx = os.environ.get("CXX", "g++")
        cmd = (
            [cxx, "-shared", "-fPIC", "-O3", "-Wall", "-I."]
            + tf.sysconfig.get_compile_flags()
            + ext.sources
            + ["-o", out]
            + tf.sysconfig.get_link_flags()
        )
        print(" ".join(cmd), file=sys.stderr)
        subprocess.check_call(cmd)

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")[:-1], "_fusedrec_ops.so")


setup(
    name="tf_fusedrec",
    version="0.1.0",
    description="Fused, lossless embedding communication for TFRA + Horovod recommendation training",
    packages=find_packages(include=["tf_fusedrec", "tf_fusedrec.*"]),
    ext_modules=[Extension(LIB_NAME, sources=SOURCES, depends=HEADERS)],
    cmdclass={"build_ext": TFBuildExt},
    python_requires=">=3.9",
    install_requires=["numpy<2", "pyyaml"],
    zip_safe=False,
)

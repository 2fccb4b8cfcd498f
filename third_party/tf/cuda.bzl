"""The CUDA kernels in Bazel: nvcc compiles the TF-free sources into an object when @local_config_tf says so.

Bazel 4 has no CUDA rules and nothing may be downloaded, so a genrule runs the nvcc that tf_configure found
(FUSEDREC_CUDA is False, and these macros add nothing, where TensorFlow is not built with CUDA or nvcc is missing).
"""

load("@local_config_tf//:build_defs.bzl", "CUDA_LINKOPTS", "FUSEDREC_CUDA", "NVCC")

# Compute capabilities, as setup.py's default ($TF_FUSEDREC_CUDA_ARCHS there); PTX of the last for newer GPUs.
CUDA_ARCHS = ["75", "80", "90"]

def if_fusedrec_cuda(if_true, if_false = []):
    return if_true if FUSEDREC_CUDA else if_false

def fusedrec_cuda_library(name, src, hdrs):
    """cc_library `name` holding nvcc's PIC object of `src` (a TF-free .cu.cc) and the CUDA runtime; no-op without CUDA."""
    if not FUSEDREC_CUDA:
        return
    gencode = " ".join(["-gencode=arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS])
    gencode += " -gencode=arch=compute_%s,code=compute_%s" % (CUDA_ARCHS[-1], CUDA_ARCHS[-1])
    obj = name + ".pic.o"
    native.genrule(
        name = name + "_nvcc",
        srcs = [src] + hdrs,
        outs = [obj],
        cmd = "%s -c -x cu -std=c++17 -O3 -I. -Xcompiler -fPIC %s $(location %s) -o $@" % (NVCC, gencode, src),
        message = "nvcc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [obj],
        linkopts = CUDA_LINKOPTS,
    )

"""Repository rule that exposes the pip-installed TensorFlow to Bazel.

It runs a Python interpreter (default: <workspace>/.venv/bin/python, or the
PYTHON_BIN_PATH environment variable) and asks tf.sysconfig for the header
directory, the library directory, the compile flags and the link flags. Then it
  * symlinks the header directory to  include/
  * symlinks libtensorflow_framework.so.N (the file named by the `-l:` link
    flag) next to the BUILD file,
  * writes a BUILD with cc_library(name = "tf") (headers + framework library),
  * writes build_defs.bzl with TF_COPTS / TF_LINKOPTS taken from tf.sysconfig
    (ABI macro, -std=, Eigen alignment), so nothing is hard-coded.

Usage in WORKSPACE:
    load("//third_party/tf:tf_configure.bzl", "tf_configure")
    tf_configure(name = "local_config_tf")
"""

_PYTHON_BIN_PATH = "PYTHON_BIN_PATH"
_CUDA_MODE = "TF_FUSEDREC_CUDA"  # auto (default) | 1 (required) | 0 (CPU only), as in setup.py
_CUDA_HOME = "CUDA_HOME"
_DEFAULT_PYTHON = ".venv/bin/python"

# Marker so that anything else TensorFlow (or a sitecustomize) prints on
# stdout is ignored; TensorFlow's own warnings go to stderr and are ignored.
_MARKER = "@@TF_CONFIGURE_JSON@@"

_QUERY = """
import json
import tensorflow as tf
sc = tf.sysconfig
print("{marker}" + json.dumps({{
    "version": tf.__version__,
    "include": sc.get_include(),
    "lib": sc.get_lib(),
    "compile_flags": sc.get_compile_flags(),
    "link_flags": sc.get_link_flags(),
    "built_with_cuda": tf.test.is_built_with_cuda(),
}}))
""".format(marker = _MARKER)

def _fail(msg):
    fail("\n\033[0;31mTensorFlow configuration error:\033[0m %s\n" % msg)

def _workspace_root(repository_ctx):
    # repository_ctx.workspace_root only exists in newer Bazel; this works in 4.x.
    return repository_ctx.path(Label("@//:WORKSPACE")).dirname

def _python_bin(repository_ctx):
    python = repository_ctx.os.environ.get(_PYTHON_BIN_PATH, "").strip()
    if not python:
        python = _DEFAULT_PYTHON
    if not python.startswith("/"):
        if "/" in python:
            # Relative path: relative to the workspace root.
            python = "%s/%s" % (_workspace_root(repository_ctx), python)
        else:
            # Bare name such as "python3": look it up on PATH.
            found = repository_ctx.which(python)
            if not found:
                _fail("%s=%s not found on PATH" % (_PYTHON_BIN_PATH, python))
            python = str(found)
    if not repository_ctx.path(python).exists:
        _fail(("Python interpreter '%s' does not exist. Create the virtualenv " +
               "(.venv with tensorflow installed) or set %s to a python that " +
               "can import tensorflow.") % (python, _PYTHON_BIN_PATH))
    return python

def _query_tf(repository_ctx, python):
    result = repository_ctx.execute(
        [python, "-c", _QUERY],
        environment = {
            # Keep the import quiet and fast; nothing here needs a GPU.
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "CUDA_VISIBLE_DEVICES": "",
        },
        timeout = 600,
    )
    payload = None
    for line in result.stdout.splitlines():
        if line.startswith(_MARKER):
            payload = line[len(_MARKER):]
    if result.return_code != 0 or payload == None:
        _fail(("'%s' could not import tensorflow / query tf.sysconfig " +
               "(exit code %d).\nstdout:\n%s\nstderr:\n%s") %
              (python, result.return_code, result.stdout, result.stderr))
    return json.decode(payload)

def _split_compile_flags(flags):
    """Drops -I<include> (provided by the cc_library); normalizes --std=."""
    copts = []
    for flag in flags:
        if flag.startswith("-I"):
            continue
        if flag.startswith("--std="):
            flag = flag[1:]
        copts.append(flag)
    return copts

def _split_link_flags(flags):
    """Returns (library file names from -l / -l:, remaining linker flags)."""
    libs = []
    others = []
    for flag in flags:
        if flag.startswith("-L"):
            continue
        if flag.startswith("-l:"):
            libs.append(flag[3:])
        elif flag.startswith("-l"):
            libs.append("lib%s.so" % flag[2:])
        else:
            others.append(flag)
    return libs, others

def _starlark_list(items):
    return "[\n%s]" % "".join(["    %s,\n" % repr(i) for i in items])

def _find_nvcc(repository_ctx):
    nvcc = repository_ctx.which("nvcc")
    if nvcc:
        return str(nvcc)
    home = repository_ctx.os.environ.get(_CUDA_HOME, "").strip()
    if home and repository_ctx.path(home + "/bin/nvcc").exists:
        return home + "/bin/nvcc"
    return None

def _cuda_lib_dir(repository_ctx, nvcc):
    # nvcc may be a wrapper script: ask it for its install root.
    result = repository_ctx.execute([nvcc, "--dryrun", "-c", "x.cu"])
    top = None
    for line in (result.stdout + result.stderr).splitlines():
        if "TOP=" in line:
            top = line.split("TOP=", 1)[1].strip()
    if top == None:
        top = str(repository_ctx.path(nvcc).dirname.dirname)
    for lib in ["lib64", "targets/x86_64-linux/lib"]:
        if repository_ctx.path("%s/%s/libcudart_static.a" % (top, lib)).exists:
            return "%s/%s" % (top, lib)
    _fail("libcudart_static.a not found under %s (the CUDA toolkit of %s)" % (top, nvcc))

def _cuda_config(repository_ctx, built_with_cuda):
    """Returns (nvcc or None, reason), with the same rules as setup.py's cuda_build."""
    mode = repository_ctx.os.environ.get(_CUDA_MODE, "auto").strip() or "auto"
    if mode not in ["auto", "0", "1"]:
        _fail("%s must be auto, 0 or 1, got '%s'" % (_CUDA_MODE, mode))
    if mode == "0":
        return None, "disabled by %s=0" % _CUDA_MODE
    nvcc = _find_nvcc(repository_ctx)
    if mode == "1":
        if not nvcc:
            _fail("%s=1 but nvcc is neither on PATH nor in $CUDA_HOME/bin" % _CUDA_MODE)
        return nvcc, "%s, nvcc %s" % ("TensorFlow is built with CUDA" if built_with_cuda else "forced by %s=1" % _CUDA_MODE, nvcc)
    if not built_with_cuda:
        return None, "TensorFlow is not built with CUDA"
    if not nvcc:
        return None, "TensorFlow is built with CUDA but nvcc is neither on PATH nor in $CUDA_HOME/bin"
    return nvcc, "TensorFlow is built with CUDA, nvcc %s" % nvcc

def _tf_configure_impl(repository_ctx):
    python = _python_bin(repository_ctx)
    info = _query_tf(repository_ctx, python)

    include_dir = info["include"]
    lib_dir = info["lib"]
    if not repository_ctx.path(include_dir).exists:
        _fail("TensorFlow include directory %s does not exist" % include_dir)

    copts = _split_compile_flags(info["compile_flags"])
    libs, linkopts = _split_link_flags(info["link_flags"])
    if not libs:
        _fail("tf.sysconfig.get_link_flags() names no library: %s" % info["link_flags"])

    nvcc, cuda_reason = _cuda_config(repository_ctx, info["built_with_cuda"])
    print("tf_fusedrec: CUDA kernels %s: %s" % ("built" if nvcc else "skipped", cuda_reason))
    cuda_linkopts = []
    if nvcc:
        # The static runtime, kept private (as in setup.py).
        cuda_linkopts = ["-L" + _cuda_lib_dir(repository_ctx, nvcc), "-lcudart_static", "-ldl", "-lrt", "-lpthread",
                         "-Wl,--exclude-libs,libcudart_static.a"]

    repository_ctx.symlink(include_dir, "include")
    for lib in libs:
        src = repository_ctx.path("%s/%s" % (lib_dir, lib))
        if not src.exists:
            _fail("TensorFlow library %s not found in %s" % (lib, lib_dir))
        repository_ctx.symlink(src, lib)

    repository_ctx.file("BUILD", """\
# Generated by //third_party/tf:tf_configure.bzl from {python}
# TensorFlow {version} at {lib_dir}
package(default_visibility = ["//visibility:public"])

licenses(["notice"])  # Apache 2.0

exports_files(["build_defs.bzl"])

# Headers of the installed TensorFlow (tensorflow/, Eigen, absl, ...).
cc_library(
    name = "tf_headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

# The framework shared library (libtensorflow_framework.so.N). A custom-op
# library links against it but must not carry it along: at run time it is
# the copy that `import tensorflow` already loaded.
cc_library(
    name = "tf_framework",
    srcs = {libs},
    linkopts = {linkopts},
)

# What a custom-op library depends on.
cc_library(
    name = "tf",
    deps = [
        ":tf_framework",
        ":tf_headers",
    ],
)
""".format(
        python = python,
        version = info["version"],
        lib_dir = lib_dir,
        libs = repr(libs),
        linkopts = repr(linkopts),
    ))

    repository_ctx.file("build_defs.bzl", """\
\"\"\"Generated by //third_party/tf:tf_configure.bzl -- do not edit.\"\"\"

TF_VERSION = {version}

TF_INCLUDE_DIR = {include}

TF_LIB_DIR = {lib}

# tf.sysconfig.get_compile_flags() without -I (the include dir comes with
# @local_config_tf//:tf); e.g. _GLIBCXX_USE_CXX11_ABI, -std=, EIGEN_MAX_ALIGN_BYTES.
TF_COPTS = {copts}

# tf.sysconfig.get_link_flags() without -L/-l (the library comes with
# @local_config_tf//:tf).
TF_LINKOPTS = {linkopts}

# Whether the CUDA kernels are built ({cuda_reason}), the nvcc that compiles them and the runtime's link flags.
FUSEDREC_CUDA = {cuda}

NVCC = {nvcc}

CUDA_LINKOPTS = {cuda_linkopts}
""".format(
        version = repr(info["version"]),
        include = repr(include_dir),
        lib = repr(lib_dir),
        copts = _starlark_list(copts),
        linkopts = _starlark_list(linkopts),
        cuda_reason = cuda_reason,
        cuda = repr(nvcc != None),
        nvcc = repr(nvcc or ""),
        cuda_linkopts = _starlark_list(cuda_linkopts),
    ))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = [_PYTHON_BIN_PATH, _CUDA_MODE, _CUDA_HOME],
    # Re-run after a Bazel server restart and on `bazel sync --configure`, so a
    # re-installed/upgraded TensorFlow is picked up.
    local = True,
    configure = True,
)

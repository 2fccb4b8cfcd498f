"""The op library records the TensorFlow it was built against and refuses to load under another one
(cc/kernels/build_info.cc, tf_fusedrec/ops/_loader.py)."""


import pytest
import tensorflow as tf

from tf_fusedrec.ops import _loader


def test_the_library_records_this_tensorflow():
    assert _loader.built_against(_loader.library_path()) == tf.__version__


def _copy_with_version(tmp_path, version):
    """A copy of the library whose marker names `version` (same length as the real one: the bytes stay in place)."""
    data = bytearray(open(_loader.library_path(), "rb").read())
    marker = _loader._BUILD_MARKER + tf.__version__.encode() + b";"  # noqa: SLF001
    at = data.find(marker)
    assert at >= 0 and data.find(marker, at + 1) < 0, "the marker is in the library exactly once"
    assert len(version) == len(tf.__version__)
    start = at + len(_loader._BUILD_MARKER)  # noqa: SLF001
    data[start:start + len(version)] = version.encode()
    path = tmp_path / "_fusedrec_ops.so"
    path.write_bytes(bytes(data))
    return path


def test_a_library_built_for_another_tensorflow_is_refused_naming_both(tmp_path, monkeypatch):
    other = "9" * len(tf.__version__.split(".")[0]) + tf.__version__[len(tf.__version__.split(".")[0]):]
    path = _copy_with_version(tmp_path, other)
    assert _loader.built_against(str(path)) == other
    monkeypatch.setenv("TF_FUSEDREC_OPS_LIB", str(path))
    with pytest.raises(ImportError, match=rf"built against TensorFlow {other}.*runs TensorFlow {tf.__version__}"):
        _loader.load_ops.__wrapped__()


def test_a_library_without_marker_is_refused(tmp_path, monkeypatch):
    data = open(_loader.library_path(), "rb").read().replace(_loader._BUILD_MARKER, b"x" * len(_loader._BUILD_MARKER))  # noqa: SLF001
    path = tmp_path / "_fusedrec_ops.so"
    path.write_bytes(data)
    assert _loader.built_against(str(path)) is None
    monkeypatch.setenv("TF_FUSEDREC_OPS_LIB", str(path))
    with pytest.raises(ImportError, match="no build marker"):
        _loader.load_ops.__wrapped__()


def test_a_missing_library_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_FUSEDREC_OPS_LIB", str(tmp_path / "absent.so"))
    with pytest.raises(ImportError, match="not found.*make build"):
        _loader.load_ops.__wrapped__()

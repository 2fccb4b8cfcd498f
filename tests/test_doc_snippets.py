"""The ```python blocks of README.md and of the quickstart run as they are (docs/development/docs.md, "Code blocks
that run"): a page's blocks run in order in one fresh interpreter, so a block may continue the one before it, as a
reader does. A block whose fence follows the line `<!-- snippet: skip -->` is not run; one after `<!-- snippet: tfra -->`
runs only where TFRA (the [tfra] extra) is installed. No TensorFlow start-up ERROR lines either."""

import re
import sys

import pytest

from tests.conftest import TFRA_INSTALLED
from tests.subprocess_runner import ROOT, execute, tail

pytestmark = pytest.mark.slow  # a fresh interpreter per page

PAGES = ["README.md", "docs/getting-started/quickstart.md"]
MARKERS = ("skip", "tfra")
TIMEOUT_S = 600
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*snippet:\s*(\w+)\s*-->\s*$")
STARTUP_ERRORS = re.compile(r"Unable to register cu(FFT|DNN|BLAS) factory")


def blocks(text):
    """[(marker or None, code)] of a page's ```python blocks, in order."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        if marker and marker.group(1) not in MARKERS:
            raise ValueError(f"unknown snippet marker {marker.group(0)!r} (known: {MARKERS})")
        found.append((marker.group(1) if marker else None, match.group(1)))
    return found


def program(page):
    """The code a page's runnable blocks make, in order; -> (code, number of blocks in it)."""
    chosen = [code for marker, code in blocks((ROOT / page).read_text())
              if marker is None or (marker == "tfra" and TFRA_INSTALLED)]
    return "\n".join(chosen), len(chosen)


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run(page, tmp_path):
    code, count = program(page)
    assert count, f"{page}: no ```python block to run"
    script = tmp_path / "snippets.py"
    script.write_text(code)
    rc, out, err = execute([sys.executable, str(script)], TIMEOUT_S)
    assert rc == 0, f"{page}: its python blocks failed (exit status {rc})\n{code}\nstdout: {tail(out)}\nstderr: " \
                    f"{tail(err)}"
    assert not STARTUP_ERRORS.search(err), f"{page}: TensorFlow's start-up ERROR lines:\n{tail(err)}"


def test_markers_are_read():
    text = "a\n<!-- snippet: skip -->\n```python\nnot run\n```\n\n```python\nrun\n```\n<!-- snippet: tfra -->\n" \
           "```python\ntfra\n```\n"
    assert blocks(text) == [("skip", "not run\n"), (None, "run\n"), ("tfra", "tfra\n")]
    with pytest.raises(ValueError, match="unknown snippet marker"):
        blocks("<!-- snippet: later -->\n```python\nx\n```\n")

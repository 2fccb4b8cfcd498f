"""The result tables of README.md and of the docs pages equal a fresh rendering of the committed result files
(scripts/docs_tables.py), and the plots the pages show (docs/assets/) are copies of the results' ones.

Each table marked `<!-- table:NAME from FILES -->` ... `<!-- /table -->` in a page (README.md, or a page under docs/)
is checked on its own, so a failure names the table and its page; `make docs-tables` rewrites them. The script uses
only the standard library and reads JSON and text files: no TensorFlow, well under a second.
"""

import ast
import difflib
import sys
from pathlib import Path

import pytest

from tests.subprocess_runner import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docs_tables.py"


docs_tables = load_script(SCRIPT, "docs_tables")
PAGES = {page: (ROOT / page).read_text() for page in docs_tables.pages()}
WHERE = docs_tables.marked(PAGES)
BLOCKS = {name: (WHERE[name], indent, first, body)
          for page, text in PAGES.items() for name, indent, first, _, body in docs_tables.blocks(text, page)}


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_table_equals_its_data(name):
    assert name in BLOCKS, f"no page has a <!-- table:{name} --> ... <!-- /table --> block"
    page, indent, first, body = BLOCKS[name]
    fresh = [""] + [indent + line for line in docs_tables.render(name).split("\n")] + [""]
    if body != fresh:
        diff = "\n".join(difflib.unified_diff(body, fresh, page, "rendered from the data", lineterm=""))
        pytest.fail(f"table {name!r} ({page} line {first + 1}) differs from its data; run `make docs-tables`:\n{diff}")
    assert PAGES[page].split("\n")[first] == docs_tables.begin_marker(name, indent), (
        f"table {name!r} ({page}): its opening marker does not name the files it is read from; run `make docs-tables`")


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_each_table_reads_committed_files(name):
    for pattern in docs_tables.TABLES[name][0]:
        assert sorted(ROOT.glob(pattern)), f"table {name!r}: no committed file matches {pattern}"


def test_every_marked_table_is_known():
    assert set(BLOCKS) == set(docs_tables.TABLES)


def test_the_readme_has_its_headline_table():
    assert WHERE["readme-headline"] == "README.md"


def test_a_changed_figure_is_named_and_rewritten(tmp_path, capsys):
    page, _, first, body = BLOCKS["bench-table-backend"]
    lines = PAGES[page].split("\n")
    row = next(i for i in range(first + 1, first + 1 + len(body)) if lines[i].startswith("| fused_native |"))
    lines[row] = lines[row].replace("71,913", "71,914")
    stale_text = "\n".join(lines)
    assert docs_tables.stale(stale_text) == ["bench-table-backend"]
    copy = tmp_path / "page.md"
    copy.write_text(stale_text)
    assert docs_tables.main(["--check", str(copy)]) == 1
    assert "bench-table-backend" in capsys.readouterr().err
    assert docs_tables.main([str(copy)]) == 0
    assert copy.read_text() == PAGES[page]


def test_marker_errors_name_the_table():
    with pytest.raises(ValueError, match="unknown table 'no-such-table'"):
        docs_tables.blocks("<!-- table:no-such-table -->\n<!-- /table -->\n")
    with pytest.raises(ValueError, match="table 'bench-modes' has no <!-- /table -->"):
        docs_tables.blocks("<!-- table:bench-modes -->\n| a |\n")
    once = "<!-- table:bench-modes -->\n<!-- /table -->\n"
    with pytest.raises(ValueError, match="table 'bench-modes' is marked twice"):
        docs_tables.blocks(once + once)
    with pytest.raises(ValueError, match=r"b.md: table 'bench-modes' is marked twice \(also in a.md\)"):
        docs_tables.marked({"a.md": once, "b.md": once})


def test_the_script_imports_only_the_standard_library():
    tree = ast.parse(SCRIPT.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names), f"non-standard imports: {imported - set(sys.stdlib_module_names)}"


@pytest.mark.parametrize("name", ["serve-bench", "serve-curve"])
def test_the_serve_tables_are_the_ones_the_bench_wrote(name):
    # tf_fusedrec/serve/bench.py writes the same tables into serve_bench.md from the same JSON.
    written = ROOT / docs_tables.RESULTS / "serve" / "serve_bench.md"
    assert docs_tables.render(name) in written.read_text(), f"table {name!r} is not the one in {written}"


@pytest.mark.parametrize("plot", docs_tables.PLOTS)
def test_each_plot_a_page_shows_is_a_copy_of_its_result(plot):
    copy, result = ROOT / docs_tables.ASSETS / plot, ROOT / docs_tables.RESULTS / plot
    assert copy.is_file() and copy.read_bytes() == result.read_bytes(), (
        f"{copy.relative_to(ROOT)} is not a copy of {result.relative_to(ROOT)}; run `make docs-tables`")


def test_a_missing_plot_copy_is_named_and_copied(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(docs_tables, "ASSETS", str(tmp_path))
    assert docs_tables.stale_plots() == list(docs_tables.PLOTS)
    assert docs_tables.main(["--check"]) == 1
    assert f"{tmp_path}/hot/hot_sweep.png" in capsys.readouterr().err
    assert docs_tables.copy_plots() == list(docs_tables.PLOTS)
    assert docs_tables.stale_plots() == []
    assert docs_tables.main(["--check"]) == 0

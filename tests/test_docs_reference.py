"""The reference pages of the command lines and of the config (docs/reference/cli.md, config.md) equal a fresh
rendering from the commands' argparse parsers and the config dataclasses (scripts/docs_reference.py);
`make docs-reference` rewrites them. The script imports the commands' modules (TensorFlow with them) and runs none.
"""

import ast
import dataclasses
import re
from pathlib import Path
from typing import Optional

import pytest

from tests.subprocess_runner import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docs_reference.py"

docs_reference = load_script(SCRIPT, "docs_reference")


@pytest.mark.parametrize("page", list(docs_reference.PAGES))
def test_page_equals_its_sources(page):
    diffs = docs_reference.stale({page: docs_reference.PAGES[page]})
    if diffs:
        pytest.fail(f"{page} differs from its sources (a flag or a config key changed); run `make docs-reference`:\n"
                    f"{diffs[page]}")


def test_every_command_has_its_section_and_its_flags():
    page = (ROOT / docs_reference.CLI_PAGE).read_text()
    for command, module, function, guide in docs_reference.COMMANDS:
        assert f"\n## {command.removeprefix('python -m ')}\n" in page, command
        assert (ROOT / "docs" / guide).is_file(), f"{command}: no page docs/{guide}"
        for action in docs_reference.parser_of(module, function)._actions:
            for flag in action.option_strings:
                assert f"`{flag}`" in page or f"`{flag}, " in page or f", {flag}`" in page, f"{command} {flag}"


def test_every_top_level_key_the_parser_knows_is_on_the_page():
    from tf_fusedrec import config as cfg

    with pytest.raises(ValueError, match="unknown key 'zz_unknown'") as raised:
        cfg.parse_config({"features": [{"name": "a", "dim": 4}], "zz_unknown": 1})
    known = ast.literal_eval(re.search(r"known keys: (\[.*\])", str(raised.value))[1])
    page = (ROOT / docs_reference.CONFIG_PAGE).read_text()
    assert [key for key in known if f"`{key}`" not in page] == []


def _raw_with(path, value):
    """A minimal config whose key `path` (as VALUES names it) is `value`."""
    raw = {"features": [{"name": "a", "dim": 4}]}
    section, key = path.split(".")
    if section == "features[]":
        raw["features"][0][key] = value
    elif section == "data" and key == "on_bad_record":  # a key of the file sources only
        raw["data"] = {"source": "csv", "path": "x.csv", "schema": {"features": {"a": {}}, "label": "y"}, key: value}
    else:
        raw[section] = {key: value}
    return raw


@pytest.mark.parametrize("path", list(docs_reference.VALUES))
def test_the_values_a_key_takes_are_the_ones_its_parser_checks(path):
    from tf_fusedrec import config as cfg

    module, constant = docs_reference.VALUES[path]
    assert "not-a-value" not in getattr(__import__(module, fromlist=[constant]), constant)
    key = path.split(".")[-1]
    with pytest.raises(ValueError, match=rf"{key}|unknown optimizer"):
        cfg.parse_config(_raw_with(path, "not-a-value"))


def test_a_config_without_a_name_is_named_by_its_path(tmp_path):
    from tf_fusedrec import config as cfg

    assert docs_reference.DEFAULTS == {"name": "the file's path"}
    path = tmp_path / "c.yaml"
    path.write_text("features: [{name: a, dim: 4}]\n")
    assert cfg.load_config(path).name == str(path)


@dataclasses.dataclass
class _Commented:
    plain: int = 1  # on its line
    # above it,
    # on two lines
    above: str = "x"
    # a note on a group
    first: Optional[int] = None  # its own
    second: bool = False  # its own too


@dataclasses.dataclass
class _Uncommented:
    bare: int = 0


def test_comments_give_each_field_its_explanation_and_a_group_its_note():
    fields = docs_reference.comments_of(_Commented)
    assert [(f.name, f.doc, f.note) for f in fields] == [
        ("plain", "on its line", ""), ("above", "above it, on two lines", ""),
        ("first", "its own", "a note on a group"), ("second", "its own too", "")]
    assert [(f.default, docs_reference.type_text(f.type)) for f in fields] == [
        ("`1`", "int"), ("`x`", "string"), ("`null`", "int or null"), ("`false`", "bool")]
    with pytest.raises(ValueError, match=r"_Uncommented.bare has no comment"):
        docs_reference.comments_of(_Uncommented)


def test_markdown_escapes_markup_outside_code_and_links_pages():
    assert docs_reference.markdown("a | b, <x>, *.yaml, `a|b`", "docs/reference/cli.md") == \
        r"a \| b, &lt;x&gt;, \*.yaml, `a\|b`"
    assert docs_reference.markdown("see docs/guide/training.md", "docs/reference/config.md") == \
        "see [docs/guide/training.md](../guide/training.md)"

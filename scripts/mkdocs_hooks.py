"""MkDocs hooks (mkdocs.yml: `hooks`): every relative link of the docs pages, of README.md and of CONTRIBUTING.md names a
file or a folder of the repository, and every image a page shows is part of the site.

MkDocs checks the links between pages itself. The pages also link to files of the repository outside docs/, the raw
results above all (benchmarks/results/: JSON, logs, folders of runs), with a relative path from the page
(`../../benchmarks/results/serve/serve_bench.json` from docs/benchmarks/serving.md), which reads and works in the
repository. MkDocs reports such a link as a missing documentation file (a warning, which would fail the strict build)
or, for a folder, at INFO level (which a strict build lets pass even when the target is gone). Here every relative link
must name a file or folder on disk (a warning otherwise, which fails `mkdocs build --strict`), and MkDocs' own report
of a link that leaves docs/ is lowered to INFO. README.md and CONTRIBUTING.md are not pages of the site; their links
are checked the same way at the start of the build. An image a page shows must be part of the site (under docs/): a
plot of the results is copied to docs/assets/ by scripts/docs_tables.py (PLOTS) and shown from there.
"""

import logging
import os
import posixpath
import re

log = logging.getLogger("mkdocs.plugins.tf_fusedrec.links")

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(markdown):
    """`markdown` without its code blocks and code spans, where a link is only text."""
    return CODE.sub("", FENCE.sub("", markdown))


def _relative(targets):
    """(target, its path without anchor or query) of the relative targets among `targets`."""
    for target in targets:
        if not (EXTERNAL.match(target) or target.startswith("#")):
            yield target, target.split("#", 1)[0].split("?", 1)[0]


def broken_links(markdown, source):
    """The relative link targets of `markdown` (the text of the file `source`) that name nothing on disk."""
    return [target for target, path in _relative(LINK.findall(_prose(markdown)))
            if not os.path.exists(os.path.join(os.path.dirname(source), path))]


# The repository's own Markdown outside the site.
FRONT_PAGES = ("README.md", "CONTRIBUTING.md")
# MkDocs' report of a link to a file that is not a documentation file.
NOT_FOUND = re.compile(r"^Doc file '(?P<page>[^']+)' contains a link '(?P<url>[^'#?]+)[^']*', but the target "
                       r"(?:'[^']*' )?is not found among documentation files\.")


def _leaves_docs(page, url):
    """Whether the relative link `url` of the page `page` (its path under docs/) names something outside docs/."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(page), url)).startswith("../")


class _RepositoryLinks(logging.Filter):
    """Lowers MkDocs' warning about a link that leaves docs/ to INFO: broken_links() checks those against the
    repository instead."""

    def filter(self, record):
        m = NOT_FOUND.match(record.getMessage())
        if record.levelno == logging.WARNING and m and _leaves_docs(m["page"], m["url"]):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


_REPOSITORY_LINKS = _RepositoryLinks()


def on_config(config):
    logging.getLogger("mkdocs.structure.pages").addFilter(_REPOSITORY_LINKS)  # once: addFilter skips a filter it has
    return config


def on_pre_build(config):
    root = os.path.dirname(config.config_file_path)
    for name in FRONT_PAGES:
        with open(os.path.join(root, name)) as f:
            for target in broken_links(f.read(), os.path.join(root, name)):
                log.warning(f"{name} links to '{target}', which is not in the repository")


def on_page_markdown(markdown, page, config, files):
    for target in broken_links(markdown, page.file.abs_src_path):
        log.warning(f"Doc file '{page.file.src_uri}' links to '{target}', which is not in the repository")
    for target, path in _relative(IMAGE.findall(_prose(markdown))):
        uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), path))
        image = files.get_file_from_path(uri)
        if image is None or image.inclusion.is_excluded():
            log.warning(f"Doc file '{page.file.src_uri}' shows '{target}', which is not part of the site: show a "
                        f"copy under docs/assets/ (a plot of the results: add it to scripts/docs_tables.py's PLOTS)")
    return markdown

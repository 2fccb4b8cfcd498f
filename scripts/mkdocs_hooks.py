"""MkDocs hooks (mkdocs.yml: `hooks`): every relative link of the docs pages, of README.md and of CONTRIBUTING.md names a
file or a folder of the repository, and every image a page shows is part of the site.

MkDocs checks the links between pages itself. The pages also link to raw results under docs/ (JSON, logs, folders of
runs) that mkdocs.yml keeps out of the site, and MkDocs reports a link to such a file or folder at INFO level, which a
strict build lets pass even when the target is gone; here each one is a warning, which fails `mkdocs build --strict`.
README.md and CONTRIBUTING.md are not pages of the site; their links are checked the same way at the start of the
build. An image a page shows from a file mkdocs.yml excludes would be missing from the site: a warning too, naming the
line to add.
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
        if image is not None and image.inclusion.is_excluded():
            log.warning(f"Doc file '{page.file.src_uri}' shows '{target}', which mkdocs.yml excludes from the site: "
                        f"add '!/{uri}' to its exclude_docs")
    return markdown

"""MkDocs hook: the reference pages, generated from the code as the site builds.

The pages of :data:`reference_pages.PAGES` (the CLI, config keys, metrics, the API, the
rule, job and scenario files) are added to the site in memory: they are never in
``docs/``, so they cannot be committed stale. Every page is also checked for repository
paths it names as code (`` `deploy/agent.yaml` ``) that no longer exist: a warning, which
``mkdocs build --strict`` (``make lint``) makes an error.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from reference_pages import PAGES  # beside this file: MkDocs puts it on sys.path to load us

log = logging.getLogger("mkdocs.hooks.reference")

ROOT = Path(__file__).resolve().parents[2]
#: The repository's top-level folders a page may name paths in.
REPO_DIRS = ("sn_monitor", "deploy", "rules", "grafana", "tests", "bench", "examples", "docs")
#: `` `deploy/agent.yaml` ``, `` `sn_monitor/sim/` ``: a path as code, alone in its backquotes.
#: What the tools write (ignored by git): named, never there in a fresh checkout.
OUTPUTS = ("bench/results/",)
CODE_PATH = re.compile(r"`((?:{})/[A-Za-z0-9_./-]*)`".format("|".join(REPO_DIRS)))


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add the generated reference pages (a page of the same name in docs/ is an error)."""
    # The parts run to collect the metrics log what they do (a fault, an alert): not news.
    package_log = logging.getLogger("sn_monitor")
    level = package_log.level
    package_log.setLevel(logging.CRITICAL)
    try:
        for uri, build in PAGES.items():
            present = files.get_file_from_path(uri)
            if present is not None:
                log.warning("docs/%s is generated as the site builds: remove the file", uri)
                files.remove(present)
            files.append(File.generated(config, uri, content=build()))
    finally:
        package_log.setLevel(level)
    return files


def missing_paths(markdown: str) -> list[str]:
    """The repository paths ``markdown`` names as code that do not exist."""
    return sorted({path for path in CODE_PATH.findall(markdown)
                   if "*" not in path and not path.startswith(OUTPUTS)
                   and not (ROOT / path.rstrip("/")).exists()})


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """Warn of each repository path the page names that is not there."""
    for path in missing_paths(markdown):
        log.warning("%s names %s, which is not in the repository", page.file.src_uri, path)
    return markdown

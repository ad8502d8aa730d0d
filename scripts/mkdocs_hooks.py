"""MkDocs hooks of the documentation site (``hooks:`` in ``mkdocs.yml``).

* Marker lines ``<!-- generated: NAME -->`` in a page are replaced by the reference
  that ``scripts/docs_reference.py`` draws from the code (settings, commands, schema,
  errors, metrics, alerts, the Python API).
* ``reference/api/<module>.md``: one generated page per module of the package, so every
  object a docstring links to has a page.
* ``bench/index.md`` is the benchmark's own README (``bench/README.md``), and the
  benchmark's results (``bench/results/``) are served beside it, so the performance page
  can show the charts the runs drew.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts import docs_reference  # noqa: E402

API_PREFIX = "reference/api/"


def _api_page(module: str) -> str:
    return f"# `{module}`\n\n::: {module}\n"


def on_files(files: Files, config: Any) -> Files:
    for module in docs_reference.api_modules():
        files.append(File.generated(config, f"{API_PREFIX}{module}.md", content=_api_page(module)))
    files.append(
        File.generated(config, "bench/index.md", content=(REPO / "bench" / "README.md").read_text())
    )
    for path in sorted((REPO / "bench" / "results").iterdir()):
        if path.suffix in (".png", ".json"):
            files.append(
                File.generated(config, f"bench/results/{path.name}", abs_src_path=str(path))
            )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return docs_reference.expand(markdown)

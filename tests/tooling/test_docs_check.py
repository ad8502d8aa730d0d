"""The docs check (``scripts/docs_check.py``): the pages and docstrings pass it, and it finds
each kind of break the strict build lets through, on the breaks the pages once had."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import twophase
from scripts import docs_check
from tests.support import REPO

PAGE = REPO / "docs" / "page.md"


def problems(text: str) -> list[str]:
    found = docs_check.check_page(PAGE, textwrap.dedent(text), twophase.__version__)
    return [problem.what for problem in found]


def test_every_page_and_docstring_passes() -> None:
    found = [
        problem
        for page in docs_check.pages()
        for problem in docs_check.check_page(page, page.read_text(), twophase.__version__)
    ]
    found += docs_check.check_docstrings(REPO / "twophase")
    assert [str(problem) for problem in found] == []


def test_a_page_without_a_break_passes() -> None:
    assert (
        problems(
            """\
        # Title

        A paragraph that ends well, naming `scripts/dev.sh`.

        ```bash
        twophase status
        ```

        prints the sinks, and then:

        * an item that is long enough to be checked, ends well.
        * an item

        | a | b |
        |---|---|
        | 1 | 2 |
        """
        )
        == []
    )


# The breaks, as the pages had them.
BREAKS = {
    "a fence opened without a language": """\
        twophase.spark.claim_query(query, write)
        ```

        ```

        The batch is staged in Spark tasks.
        ```python
        query.stop()
        ```
        """,
    "a fence never closed": "```python\nx = 1\n",
    "a list item that ends without punctuation": """\
        * **Reset checkpoints refused** instead of being mistaken for replays.
        * **A record of what was delivered**: staged points are kept for a retention

        ## What it is not
        """,
    "a paragraph that starts in lower case": """\
        variables name the staging store and InfluxDB.

        epochs, decides this one, promotes it and marks it COMMITTED.
        """,
    "a paragraph that ends without punctuation": """\
        One epoch every 10 seconds. The floor stops at

        ## Next
        """,
    "a table header with no rule under it": """\
        exit 2).

        | command | what it does |

        ## The example job
        """,
    "`scripts/dev.sh demo` written twice": "`scripts/dev.sh demo` `scripts/dev.sh demo` runs.\n",
    "names bench/spark_direct.py, which does not exist": "It ran `bench/spark_direct.py`.\n",
    "a 0.3.0 wheel; this version is": "Install `dist/twophase-0.3.0-py3-none-any.whl`.\n",
    "a snippet marker mangled": '```python\n--8 < --"tests/plugins/kind.py"\n```\n',
    "a snippet of examples/none.py, which does not exist": (
        '```python\n--8<-- "examples/none.py"\n```\n'
    ),
}


@pytest.mark.parametrize("what", list(BREAKS))
def test_each_break_is_found(what: str) -> None:
    assert any(found.startswith(what) for found in problems(BREAKS[what])), problems(BREAKS[what])


def test_a_table_header_with_no_rows_is_found() -> None:
    assert problems("| a | b |\n|---|---|\n\nText.\n") == ["a table header with no rows"]


def test_a_docstring_wrapped_twice_is_found(tmp_path: Path) -> None:
    module = tmp_path / "broken.py"
    module.write_text(
        '"""Writers for the InfluxDB write APIs.\n\n'
        "A writer sends one body in one attempt and never retries: retrying, batching and\n"
        "bisection live in [`twophase.targets.sender`][twophase.targets.sender], which\n"
        "only\n"
        "needs the small [`InfluxWriter`][twophase.influx.writers.InfluxWriter] interface.\n"
        '"""\n'
    )
    ast.parse(module.read_text())
    (found,) = docs_check.check_docstrings(tmp_path)
    assert found.line == 5 and "'only'" in found.what

"""Shipping the ``twophase`` package to executors, as Spark users expect.

Executors import ``twophase`` to stage rows. On a cluster whose Python has it installed (the
same virtualenv everywhere, or ``--archives`` of a packed one) nothing is needed. Otherwise
[`ship_package`][twophase.spark.executor_package.ship_package] zips the package the driver runs from
and adds it with ``SparkContext.addPyFile``, which is what ``spark-submit --py-files
twophase.zip`` does. Its dependencies (psycopg, SQLAlchemy, influxdb-client, pyarrow) must
be installed on the executors: they contain compiled code that a zip cannot carry.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import twophase
from twophase.errors import ConfigError

ZIP_NAME = f"twophase-{twophase.__version__}.zip"


def package_zip(directory: Path | None = None) -> Path:
    """A zip of the ``twophase`` package's Python sources (``twophase/...`` inside).

    Written to ``directory`` (default: a new temporary directory, removed when
    this process exits); returns its path.
    """
    root = Path(twophase.__file__).resolve().parent
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="twophase-pyfiles-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    target = directory / ZIP_NAME
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(root.rglob("*.py")):
            archive.write(source, Path("twophase") / source.relative_to(root))
    return target


def ship_package(spark: Any, directory: Path | None = None) -> Path:
    """Add a zip of ``twophase`` to the Spark context's Python path on every executor.

    Not under Spark Connect: the server runs the protocol in its own Python
    (ConfigError; install twophase there)."""
    try:
        context = spark.sparkContext
    except Exception:  # a Connect session has no SparkContext
        raise ConfigError(
            "ship_package",
            "a Spark Connect client cannot ship twophase; the server runs the protocol, "
            "so install twophase in the Python its spark.pyspark.python names",
        ) from None
    path = package_zip(directory)
    context.addPyFile(str(path))
    return path

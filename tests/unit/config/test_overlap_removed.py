"""``promotion = overlap`` was removed: a configuration that still names it fails when it
is read, wherever promotion is read (variable, file, Spark option, the CLI's commands),
with an error naming the option and the choices left, rather than running another way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from twophase.cli import main
from twophase.config import PROMOTIONS, load_config
from twophase.errors import ConfigError
from twophase.spark.source import TwoPhaseDataSource

BASE = {
    "TWOPHASE_STAGING_URL": "postgresql+psycopg://u@localhost/db",
    "TWOPHASE_TARGET_URL": "http://localhost:8086",
}
SCHEMA = StructType(
    [
        StructField("k", StringType()),
        StructField("v", LongType()),
        StructField("time", TimestampType()),
    ]
)
# Servers named but never reached: the configuration is refused before any connection.
OPTIONS = {
    "sink_id": "s",
    "measurement": "m",
    "tags": "k",
    "staging_url": BASE["TWOPHASE_STAGING_URL"],
    "target_url": BASE["TWOPHASE_TARGET_URL"],
}
PROBLEM = "'overlap' was removed: promotion is one of inline, background"


def test_the_choices_left_are_inline_and_background() -> None:
    assert PROMOTIONS == ("inline", "background")


def test_the_variable_naming_overlap_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={**BASE, "TWOPHASE_PROMOTION": "overlap"})
    assert str(caught.value) == f"TWOPHASE_PROMOTION: {PROBLEM}"


def test_the_file_naming_overlap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twophase.toml"
    path.write_text('promotion = "Overlap"\n')  # choices are read case-blind
    with pytest.raises(ConfigError) as caught:
        load_config(env={**BASE, "TWOPHASE_CONFIG": str(path)})
    assert str(caught.value) == f"promotion in {path}: {PROBLEM}"


def test_the_option_naming_overlap_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env=BASE, promotion="overlap")
    assert str(caught.value) == f"promotion: {PROBLEM}"


def test_the_spark_option_naming_overlap_is_refused() -> None:
    source = TwoPhaseDataSource({**OPTIONS, "promotion": "overlap"})
    with pytest.raises(ConfigError) as caught:
        source.streamWriter(SCHEMA, False)
    assert str(caught.value) == f"promotion: {PROBLEM}"


def test_a_command_fails_naming_the_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("TWOPHASE_")]:
        monkeypatch.delenv(key)
    for key, value in {**BASE, "TWOPHASE_PROMOTION": "overlap"}.items():
        monkeypatch.setenv(key, value)
    code = main(["resend", "--sink", "s", "--all", "--json"])
    assert code == 1
    assert json.loads(capsys.readouterr().err) == {
        "error": f"TWOPHASE_PROMOTION: {PROBLEM}",
        "setting": "promotion",
        "exit_code": 1,
    }


@pytest.mark.parametrize("promotion", ["inline", "background"])
def test_the_choices_left_still_load(promotion: str) -> None:
    assert load_config(env={**BASE, "TWOPHASE_PROMOTION": promotion}).target.promotion == promotion

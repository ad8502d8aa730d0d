"""Former setting names (aliases: ``influx_url`` of ``target_url``): read wherever the
current name is (option, variable, ``_FILE``, per-target variable, file key, CLI flag,
Spark option); two names of one setting with different values in one source are refused
naming both; errors name what the user set."""

from __future__ import annotations

from pathlib import Path

import pytest

from twophase.cli import main
from twophase.cli.commands import full_config
from twophase.cli.parser import build_parser
from twophase.config import (
    ALIASES,
    BY_NAME,
    CLI_ALIASES,
    OPTIONS,
    SETTINGS,
    load_config,
    load_target_config,
)
from twophase.errors import ConfigError
from twophase.spark.options import parse_options

pytestmark = pytest.mark.unit

STAGING = {"TWOPHASE_STAGING_URL": "postgresql+psycopg://tp@db.example:5432/tp"}
SHARED = {**STAGING, "TWOPHASE_INFLUX_API": "v1", "TWOPHASE_INFLUX_DB": "metrics"}
ONE = {**SHARED, "TWOPHASE_TARGET_URL": "https://influx:8086"}
TWO = {**SHARED, "TWOPHASE_TARGETS": "a=https://influx-a:8086,b=https://influx-b:8086"}
RENAMED = {
    "influx_url": "target_url",
    "influx_timeout": "target_timeout",
    "influx_batch_points": "target_batch_points",
    "influx_batch_bytes": "target_batch_bytes",
    "influx_retry_deadline": "target_retry_deadline",
    "influx_retry_initial": "target_retry_initial",
    "influx_retry_max": "target_retry_max",
    "influx_tls_ca": "target_tls_ca",
    "influx_tls_cert": "target_tls_cert",
    "influx_tls_key": "target_tls_key",
    "influx_user": "target_username",
    "influx_password": "target_password",
}


def refused(env: dict[str, str], **explicit: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(env=env, **explicit)
    return info.value


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "twophase.toml"
    path.write_text(text)
    return {"TWOPHASE_CONFIG": str(path)}


def test_every_former_name_is_an_alias_of_its_setting() -> None:
    assert ALIASES == RENAMED
    for alias, option in RENAMED.items():
        assert BY_NAME[alias] is BY_NAME[option]
        assert alias not in OPTIONS  # listed as known options: the current names only
    influx_own = {"influx_api", "influx_db", "influx_rp", "influx_org", "influx_bucket"}
    assert influx_own | {"influx_token"} <= set(OPTIONS)
    assert CLI_ALIASES == ("influx_url",)
    assert len({s.name for s in SETTINGS} & set(ALIASES)) == 0


def test_a_former_variable_still_sets_its_setting() -> None:
    env = {
        **SHARED,
        "TWOPHASE_INFLUX_URL": "https://influx:8086",
        "TWOPHASE_INFLUX_TIMEOUT": "3s",
        "TWOPHASE_INFLUX_BATCH_POINTS": "7",
        "TWOPHASE_INFLUX_USER": "writer",
        "TWOPHASE_INFLUX_PASSWORD": "s3cret",
    }
    influx = load_target_config(env=env)
    assert (influx.url, influx.timeout_s, influx.batch_points) == ("https://influx:8086", 3.0, 7)
    assert influx.username == "writer"
    assert influx.password is not None and influx.password.reveal() == "s3cret"


def test_a_former_secret_variable_may_name_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    influx = load_target_config(env={**ONE, "TWOPHASE_INFLUX_PASSWORD_FILE": str(secret)})
    assert influx.password is not None and influx.password.reveal() == "from-file"


def test_an_error_names_the_former_variable_the_user_set() -> None:
    error = refused({**ONE, "TWOPHASE_INFLUX_TIMEOUT": "soon"})
    assert error.option == "TWOPHASE_INFLUX_TIMEOUT"
    error = refused({**ONE, "TWOPHASE_TARGET_TIMEOUT": "soon"})
    assert error.option == "TWOPHASE_TARGET_TIMEOUT"
    error = refused(SHARED)  # nothing set: the current name is the one told
    assert error.option == "TWOPHASE_TARGET_URL"


def test_both_names_with_different_values_are_refused_naming_both() -> None:
    error = refused({**ONE, "TWOPHASE_INFLUX_URL": "https://other:8086"})
    assert error.option == "TWOPHASE_TARGET_URL"
    assert "TWOPHASE_INFLUX_URL" in error.problem
    explicit = load_target_config(
        env={**ONE, "TWOPHASE_TARGET_PASSWORD": "one-s3cret"}, influx_password="two"
    )  # the environment is below an explicit value: no clash
    assert explicit.password is not None and explicit.password.reveal() == "two"
    env = {**ONE, "TWOPHASE_TARGET_PASSWORD": "one-s3cret", "TWOPHASE_INFLUX_PASSWORD": "two"}
    error = refused(env)
    assert (error.option, "TWOPHASE_INFLUX_PASSWORD" in error.problem) == (
        "TWOPHASE_TARGET_PASSWORD",
        True,
    )
    assert "s3cret" not in str(error) and "two" not in error.problem.split(":")[-1]
    error = refused(ONE, target_timeout="1s", influx_timeout="2s")
    assert (error.option, "influx_timeout" in error.problem) == ("target_timeout", True)


def test_both_names_with_the_same_value_are_accepted(tmp_path: Path) -> None:
    env = {**ONE, "TWOPHASE_INFLUX_URL": "https://influx:8086", "TWOPHASE_INFLUX_TIMEOUT": "4s"}
    influx = load_target_config(env={**env, "TWOPHASE_TARGET_TIMEOUT": "4s"})
    assert (influx.url, influx.timeout_s) == ("https://influx:8086", 4.0)
    influx = load_target_config(env=ONE, target_timeout="5s", influx_timeout="5s")
    assert influx.timeout_s == 5.0


def test_a_former_name_in_one_source_loses_to_the_current_in_a_higher_one() -> None:
    """Precedence goes by source, whatever the name: explicit, environment, file."""
    influx = load_target_config(env={**ONE, "TWOPHASE_INFLUX_TIMEOUT": "9s"}, target_timeout="1s")
    assert influx.timeout_s == 1.0
    influx = load_target_config(env={**ONE, "TWOPHASE_TARGET_TIMEOUT": "9s"}, influx_timeout="1s")
    assert influx.timeout_s == 1.0


def test_a_targets_former_variables_are_its_overrides(tmp_path: Path) -> None:
    secret = tmp_path / "b-password"
    secret.write_text("b-s3cret")
    env = {
        **TWO,
        "TWOPHASE_TARGET_B_INFLUX_TIMEOUT": "2s",
        "TWOPHASE_TARGET_B_INFLUX_PASSWORD_FILE": str(secret),
        "TWOPHASE_TARGET_A_TARGET_BATCH_POINTS": "3",
    }
    a, b = load_target_config(env=env).targets
    assert (a.config.batch_points, b.config.timeout_s) == (3, 2.0)
    assert b.config.password is not None and b.config.password.reveal() == "b-s3cret"
    error = refused({**env, "TWOPHASE_TARGET_B_TARGET_TIMEOUT": "3s"})
    assert error.option == "TWOPHASE_TARGET_B_TARGET_TIMEOUT"
    assert "TWOPHASE_TARGET_B_INFLUX_TIMEOUT" in error.problem
    error = refused({**env, "TWOPHASE_TARGET_B_INFLUX_TIMEOUT": "soon"})
    assert error.option == "TWOPHASE_TARGET_B_INFLUX_TIMEOUT"


def test_the_current_names_variables_are_not_taken_for_a_targets() -> None:
    """TWOPHASE_TARGET_URL, _TIMEOUT, _PASSWORD_FILE... begin like a target's override
    (TWOPHASE_TARGET_<NAME>_<OPTION>) but are the settings of every target."""
    env = {**TWO, "TWOPHASE_TARGET_TIMEOUT": "6s", "TWOPHASE_TARGET_TLS_CA": "/no/such/ca.pem"}
    error = refused(env)
    assert error.option == "TWOPHASE_TARGET_TLS_CA"  # read as a path, not refused as a name
    del env["TWOPHASE_TARGET_TLS_CA"]
    assert [t.config.timeout_s for t in load_target_config(env=env).targets] == [6.0, 6.0]


def test_former_keys_in_the_file(tmp_path: Path) -> None:
    text = (
        'influx_url = "http://influx:8086"\ninflux_retry_max = "4s"\n'
        'influx_db = "m"\ninflux_api = "v1"\n'
    )
    influx = load_target_config(env={**STAGING, **write(tmp_path, text)})
    assert (influx.url, influx.retry_max_s) == ("http://influx:8086", 4.0)
    tables = '[targets.a]\nurl = "http://h"\ninflux_timeout = "2s"\n'
    a, *_ = load_target_config(env={**SHARED, **write(tmp_path, tables)}).targets
    assert a.config.timeout_s == 2.0


def test_both_keys_in_the_file_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "twophase.toml"
    same = 'target_url = "http://h:8086"\ninflux_url = "http://h:8086"\n'
    assert load_target_config(env={**SHARED, **write(tmp_path, same)}).url == "http://h:8086"
    clash = '[targets.a]\nurl = "http://h"\ntarget_timeout = "1s"\ninflux_timeout = "2s"\n'
    error = refused({**SHARED, **write(tmp_path, clash)})
    assert error.option == f"targets.a.target_timeout in {path}"
    assert f"targets.a.influx_timeout in {path}" in error.problem


@pytest.fixture
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in [k for k in os.environ if k.startswith("TWOPHASE_")]:
        monkeypatch.delenv(key)
    for key, value in SHARED.items():
        monkeypatch.setenv(key, value)


@pytest.mark.usefixtures("cli_environment")
def test_the_former_cli_flag_still_works() -> None:
    args = build_parser().parse_args(["--influx-url", "http://i:8086", "db", "current"])
    assert full_config(args).target.url == "http://i:8086"
    args = build_parser().parse_args(["verify", "--sink", "s", "--influx-url", "http://i:8086"])
    assert full_config(args).target.url == "http://i:8086"
    both = ["--influx-url", "http://i:8086", "--target-url", "http://i:8086", "db", "current"]
    assert full_config(build_parser().parse_args(both)).target.url == "http://i:8086"


@pytest.mark.usefixtures("cli_environment")
def test_the_former_and_current_cli_flags_must_agree(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--influx-url", "http://i:8086", "--target-url", "http://j:8086"]
    code = main([*argv, "verify", "--sink", "s"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--target-url: is set together with influx_url" in err
    code = main(["--influx-url", "ftp//x", "verify", "--sink", "s"])
    assert (code, "--influx-url: " in capsys.readouterr().err) == (2, True)


def test_a_former_name_is_a_spark_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWOPHASE_CONFIG", raising=False)
    for key in ("TWOPHASE_TARGET_TIMEOUT", "TWOPHASE_INFLUX_TIMEOUT", "TWOPHASE_INFLUX_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TWOPHASE_STAGING_URL", STAGING["TWOPHASE_STAGING_URL"])
    monkeypatch.setenv("TWOPHASE_TARGET_URL", "http://localhost:8086")
    sink = parse_options({"sink_id": "s", "measurement": "m", "INFLUX_TIMEOUT": "6s"})
    assert sink.config().target.timeout_s == 6.0
    with pytest.raises(ConfigError) as info:
        parse_options({"sink_id": "s", "measurement": "m", "influx_password": "p"})
    assert info.value.option == "influx_password" and "is a secret" in info.value.problem
    with pytest.raises(ConfigError) as info:
        parse_options(
            {"sink_id": "s", "measurement": "m", "influx_timeout": "6s"} | {"target_timeout": "7s"}
        )
    assert "influx_timeout" in info.value.problem

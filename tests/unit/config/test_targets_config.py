"""Several named InfluxDB targets per sink, configuration side: the target list, each
target's overrides (environment and TOML file), the file's precedence, and errors that
name the variable (or the file and key) without a secret."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from twophase.config import (
    CLI_FLAGS,
    DEFAULT_TARGET,
    PER_TARGET,
    NamedTarget,
    Secret,
    load_config,
    load_setting,
    load_target_config,
    target_env_name,
)
from twophase.errors import ConfigError

pytestmark = pytest.mark.unit

STAGING = {"TWOPHASE_STAGING_URL": "postgresql+psycopg://tp@db.example:5432/tp"}
SHARED = {**STAGING, "TWOPHASE_INFLUX_API": "v1", "TWOPHASE_INFLUX_DB": "metrics"}
TWO = {**SHARED, "TWOPHASE_TARGETS": "a=http://influx-a:8086,b=https://influx-b:8086/"}


def refused(env: dict[str, str], **explicit: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(env=env, **explicit)
    return info.value


def test_targets_are_parsed_in_order_and_the_first_is_the_url() -> None:
    influx = load_target_config(env=TWO)
    assert [(t.name, t.config.url) for t in influx.targets] == [
        ("a", "http://influx-a:8086"),
        ("b", "https://influx-b:8086"),
    ]
    assert influx.url == "http://influx-a:8086"  # code that talks to one server keeps working
    assert influx.named_targets() == influx.targets
    for target in influx.targets:
        assert target.config == replace(influx, url=target.config.url, targets=())
        assert target.config.targets == ()


def test_the_new_settings_have_their_defaults_and_read_durations() -> None:
    influx = load_target_config(env=TWO)
    assert (influx.min_targets, influx.target_deadline_s, influx.target_max_lag_s) == (
        1,
        5.0,
        86400.0,
    )
    env = {**TWO, "TWOPHASE_MIN_TARGETS": "2", "TWOPHASE_TARGET_DEADLINE": "500ms"}
    influx = load_target_config(env={**env, "TWOPHASE_TARGET_MAX_LAG": "2h"})
    assert (influx.min_targets, influx.target_deadline_s, influx.target_max_lag_s) == (
        2,
        0.5,
        7200.0,
    )


def test_without_targets_named_targets_is_one_default_target_equal_to_the_config() -> None:
    influx = load_target_config(env={**SHARED, "TWOPHASE_TARGET_URL": "http://one:8086"})
    assert influx.targets == ()
    assert influx.named_targets() == (NamedTarget(DEFAULT_TARGET, influx),)
    assert DEFAULT_TARGET == "default"


def test_targets_given_explicitly_as_text_or_mapping() -> None:
    text = load_target_config(env=SHARED, targets="x=http://h1:8086, y_2=http://h2:8086")
    mapping = load_target_config(env=SHARED, targets={"x": "http://h1:8086", "y_2": "http://h2"})
    assert [t.name for t in text.targets] == [t.name for t in mapping.targets] == ["x", "y_2"]
    assert load_setting("targets", {}, targets="a-1=http://h") == (("a-1", "http://h"),)


@pytest.mark.parametrize(
    ("targets", "says"),
    [
        ("A=http://h:8086", "entry 1 (name 'A'): a target's name must match"),
        ("1a=http://h:8086", "entry 1 (name '1a')"),
        ("a b=http://h:8086", "must match [a-z][a-z0-9_-]*"),
        ("http://h:8086", "entry 1 ('http://h:8086') is not name=http(s)://host:port"),
        ("a=http://h:8086,a=http://g:8086", "target 'a' is named twice"),
        (
            "eu-west=http://h,eu_west=http://g",
            "would share the variables TWOPHASE_TARGET_EU_WEST_*",
        ),
        ("a=ftp//h:8086", "target 'a': 'ftp//h:8086' is not an http(s) URL"),
        ("a=http://", "is not an http(s) URL"),
        ("a=http://h:8086,", "entry 2 (empty) is not name="),
        (" , ", "entry 1 (empty)"),
    ],
)
def test_a_bad_target_list_names_the_variable_and_the_entry(targets: str, says: str) -> None:
    error = refused({**SHARED, "TWOPHASE_TARGETS": targets})
    assert error.option == "TWOPHASE_TARGETS"
    assert says in error.problem


def test_an_empty_explicit_target_list_is_refused() -> None:
    error = refused(SHARED, targets="")
    assert error.option == "targets" and "names no target" in error.problem


@pytest.mark.parametrize(
    "targets",
    [
        "a=http://u:hunter2@h:8086",  # a password in a target's URL
        "http://u:hunter2@h:8086",  # no name: the entry is shown masked
        "https://u:p=hunter2@h:8086",  # the "=" in the password is not the name's
        "a=ftp://u:hunter2@h",
    ],
)
def test_a_password_in_a_target_url_is_never_shown(targets: str) -> None:
    error = refused({**SHARED, "TWOPHASE_TARGETS": targets})
    assert error.option == "TWOPHASE_TARGETS"
    assert "hunter2" not in str(error)


def test_a_password_in_a_target_url_points_at_the_targets_password_variable() -> None:
    error = refused({**SHARED, "TWOPHASE_TARGETS": "b=http://u:hunter2@h:8086"})
    assert "use TWOPHASE_TARGET_B_TARGET_PASSWORD" in error.problem


def test_neither_url_nor_targets_is_required_naming_the_url() -> None:
    error = refused(SHARED)
    assert error.option == "TWOPHASE_TARGET_URL"
    assert str(error).startswith("TWOPHASE_TARGET_URL: is required but not set")
    assert "TWOPHASE_TARGETS" in error.problem


def test_both_url_and_targets_name_both() -> None:
    error = refused({**TWO, "TWOPHASE_TARGET_URL": "http://one:8086"})
    assert error.option == "TWOPHASE_TARGETS"
    assert "TWOPHASE_TARGET_URL" in error.problem
    error = refused(SHARED, target_url="http://one:8086", targets="a=http://h")
    assert (error.option, "target_url" in error.problem) == ("targets", True)


def test_an_explicit_url_replaces_targets_from_the_environment() -> None:
    """The first source that names the servers decides, as for any one setting."""
    influx = load_target_config(env=TWO, target_url="http://one:8086")
    assert (influx.url, influx.targets) == ("http://one:8086", ())
    influx = load_target_config(
        env={**SHARED, "TWOPHASE_TARGET_URL": "http://one"}, targets="c=http://c"
    )
    assert [t.name for t in influx.targets] == ["c"]


@pytest.mark.parametrize(
    ("env", "count"),
    [
        ({**TWO, "TWOPHASE_MIN_TARGETS": "3"}, "2 target(s)"),
        ({**SHARED, "TWOPHASE_TARGET_URL": "http://one", "TWOPHASE_MIN_TARGETS": "2"}, "1 target"),
    ],
)
def test_min_targets_above_the_number_of_targets_is_refused(
    env: dict[str, str], count: str
) -> None:
    error = refused(env)
    assert error.option == "TWOPHASE_MIN_TARGETS"
    assert count in error.problem


def test_min_targets_is_at_least_one() -> None:
    assert refused({**TWO, "TWOPHASE_MIN_TARGETS": "0"}).option == "TWOPHASE_MIN_TARGETS"


def test_two_targets_on_one_server_and_database_are_refused_naming_both() -> None:
    env = {**SHARED, "TWOPHASE_TARGETS": "a=http://h:8086,b=http://g:8086,c=http://h:8086"}
    error = refused(env)
    assert error.option == "TWOPHASE_TARGETS"
    assert "targets 'a' and 'c' write to the same server and database" in error.problem
    assert "(http://h:8086, db 'metrics')" in error.problem
    assert "catch-up would write old values over" in error.problem
    assert refused(SHARED, targets="a=http://h,b=http://h").option == "targets"


@pytest.mark.parametrize(
    ("targets", "overrides"),
    [
        ("a=http://h:8086,b=http://h:8086", {"TWOPHASE_TARGET_B_INFLUX_DB": "other"}),
        ("a=http://h:8086,b=http://h:8087", {}),  # another port
        ("a=http://h:8086,b=https://h:8086", {}),  # another scheme
        ("a=http://h:8086,b=http://g:8086", {}),  # another host
        ("a=http://p/one,b=http://p/two", {}),  # two servers behind one proxy
        # Another retention policy is other storage; none (the default) and a named one
        # may be too: which one is the default is the server's to say.
        ("a=http://h:8086,b=http://h:8086", {"TWOPHASE_TARGET_B_INFLUX_RP": "long"}),
        ("a=http://localhost:8086,b=http://127.0.0.1:8086", {}),  # names are not resolved
    ],
)
def test_targets_on_another_server_or_database_are_accepted(
    targets: str, overrides: dict[str, str]
) -> None:
    influx = load_target_config(env={**SHARED, "TWOPHASE_TARGETS": targets, **overrides})
    assert [t.name for t in influx.targets] == ["a", "b"]


@pytest.mark.parametrize(
    "targets",
    [
        "a=http://h:8086,b=http://h:8086/",  # a trailing slash
        "a=http://Influx.Example:8086,b=HTTP://influx.example:8086",  # case of scheme, host
        "a=http://h,b=http://h:80",  # the default port
        "a=https://h/,b=https://h:443",
        "a=http://h:8086/db-proxy,b=http://h:8086/db-proxy/",
        "a=http://[::1]:8086,b=http://[::1]:8086/",
        "a=http://reader@h:8086,b=http://h:8086",  # whoever writes, the data is the server's
    ],
)
def test_spellings_of_one_url_are_one_server(targets: str) -> None:
    error = refused({**SHARED, "TWOPHASE_TARGETS": targets})
    assert "targets 'a' and 'b' write to the same server" in error.problem
    assert "reader" not in error.problem


def test_the_same_retention_policy_of_one_database_is_refused() -> None:
    env = {**SHARED, "TWOPHASE_TARGETS": "a=http://h,b=http://h", "TWOPHASE_INFLUX_RP": "long"}
    error = refused(env)
    assert "(http://h:80, db 'metrics', retention policy 'long')" in error.problem


V2 = {
    **STAGING,
    "TWOPHASE_INFLUX_API": "v2",
    "TWOPHASE_INFLUX_ORG": "o",
    "TWOPHASE_INFLUX_BUCKET": "bk",
    "TWOPHASE_TARGETS": "a=http://h:8086,b=http://h:8086",
}


def test_v2_targets_with_one_bucket_of_one_org_are_refused() -> None:
    error = refused(V2)
    assert "targets 'a' and 'b' write to the same server and bucket" in error.problem
    assert "(http://h:8086, bucket 'bk' of org 'o')" in error.problem
    assert "give each its own bucket or server" in error.problem
    for var in ("TWOPHASE_TARGET_B_INFLUX_BUCKET", "TWOPHASE_TARGET_B_INFLUX_ORG"):
        assert len(load_target_config(env={**V2, var: "other"}).targets) == 2
    # The 2.x API writes to no database: one influx_db for both is no clash.
    other_org = {"TWOPHASE_INFLUX_DB": "x", "TWOPHASE_TARGET_B_INFLUX_ORG": "o2"}
    assert len(load_target_config(env={**V2, **other_org}).targets) == 2


def test_v3_targets_with_one_database_are_refused() -> None:
    env = {**STAGING, "TWOPHASE_INFLUX_API": "v3", "TWOPHASE_INFLUX_DB": "m"}
    error = refused({**env, "TWOPHASE_TARGETS": "a=http://h:8181,b=http://h:8181"})
    assert "same server and database (http://h:8181, db 'm')" in error.problem


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"TWOPHASE_INFLUX_DB": "m"}, "db 'm'"),  # a 1.x server
        ({"TWOPHASE_INFLUX_ORG": "o", "TWOPHASE_INFLUX_BUCKET": "bk"}, "bucket 'bk' of org 'o'"),
        # Each its own database, but one bucket: a 2.x server would get both in it.
        (
            {
                "TWOPHASE_INFLUX_DB": "m",
                "TWOPHASE_TARGET_B_INFLUX_DB": "m2",
                "TWOPHASE_INFLUX_ORG": "o",
                "TWOPHASE_INFLUX_BUCKET": "bk",
            },
            "bucket 'bk' of org 'o'",
        ),
    ],
)
def test_with_api_auto_both_the_database_and_the_bucket_are_compared(
    overrides: dict[str, str], says: str
) -> None:
    env = {**STAGING, "TWOPHASE_INFLUX_API": "auto", "TWOPHASE_TARGETS": "a=http://h,b=http://h"}
    error = refused({**env, **overrides})
    assert says in error.problem and "influx_api auto" in error.problem


def test_the_same_server_and_database_in_the_file_names_the_files_key(tmp_path: Path) -> None:
    env = write(tmp_path, TOML.replace("https://influx-b:8086", "http://INFLUX-A:8086/"))
    env["TWOPHASE_TARGET_B_INFLUX_DB"] = "metrics"  # over b's own database in the file
    error = refused(env)
    assert error.option == f"targets in {tmp_path / 'twophase.toml'}"
    assert "targets 'a' and 'b'" in error.problem


def test_the_same_server_message_holds_no_credentials() -> None:
    env = {
        **SHARED,
        "TWOPHASE_TARGETS": "a=http://alice@h:8086,b=http://h:8086",
        "TWOPHASE_TARGET_USERNAME": "bob",
        "TWOPHASE_TARGET_PASSWORD": "hunter2",
        "TWOPHASE_INFLUX_TOKEN": "tok-s3cret",
    }
    error = refused(env)
    assert "targets 'a' and 'b'" in error.problem
    for secret in ("alice", "bob", "hunter2", "tok-s3cret", "@"):
        assert secret not in str(error)


def test_overrides_from_the_environment_apply_to_their_target_only() -> None:
    env = {
        **TWO,
        "TWOPHASE_TARGET_B_INFLUX_DB": "metrics_b",
        "TWOPHASE_TARGET_B_TARGET_TIMEOUT": "30s",
        "TWOPHASE_TARGET_B_TARGET_PASSWORD": "b-s3cret",
        "TWOPHASE_TARGET_OTHER_INFLUX_DB": "x",  # another sink's target: left alone
    }
    a, b = load_target_config(env=env).targets
    assert (a.config.influxdb.database, a.config.timeout_s, a.config.password) == (
        "metrics",
        10.0,
        None,
    )
    assert (b.config.influxdb.database, b.config.timeout_s) == ("metrics_b", 30.0)
    assert b.config.password == Secret("b-s3cret")
    assert "b-s3cret" not in repr(load_config(env=env))


def test_a_target_name_with_a_dash_is_spelt_with_an_underscore() -> None:
    assert target_env_name("eu-west", "influx_db") == "TWOPHASE_TARGET_EU_WEST_INFLUX_DB"
    env = {
        **SHARED,
        "TWOPHASE_TARGETS": "eu-west=http://h",
        "TWOPHASE_TARGET_EU_WEST_INFLUX_DB": "e",
    }
    assert load_target_config(env=env).targets[0].config.influxdb.database == "e"


def test_a_secret_override_from_a_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("b-token\n")
    env = {**TWO, "TWOPHASE_TARGET_B_INFLUX_TOKEN_FILE": str(token)}
    assert load_target_config(env=env).targets[1].config.influxdb.token == Secret("b-token")
    missing = {**TWO, "TWOPHASE_TARGET_B_INFLUX_TOKEN_FILE": str(tmp_path / "missing")}
    assert refused(missing).option == "TWOPHASE_TARGET_B_INFLUX_TOKEN_FILE"


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("TWOPHASE_TARGET_B_TARGET_BATCH_POINTS", "0"),
        ("TWOPHASE_TARGET_B_INFLUX_API", "v9"),
        ("TWOPHASE_TARGET_B_TARGET_TIMEOUT", "soon"),
        ("TWOPHASE_TARGET_B_TARGET_TLS_CA", "/no/such/ca.pem"),
    ],
)
def test_a_bad_override_names_its_variable(var: str, value: str) -> None:
    error = refused({**TWO, var: value})
    assert (error.option, str(error).startswith(var)) == (var, True)


def test_each_target_is_checked_for_its_api_naming_its_variable() -> None:
    error = refused({**TWO, "TWOPHASE_TARGET_B_INFLUX_API": "v2"})
    assert error.option == "TWOPHASE_TARGET_B_INFLUX_BUCKET"
    assert "TWOPHASE_INFLUX_BUCKET" in error.problem  # the shared one would do too
    env = {**TWO, "TWOPHASE_TARGET_B_INFLUX_API": "v2", "TWOPHASE_TARGET_B_INFLUX_ORG": "o"}
    b = load_target_config(env={**env, "TWOPHASE_TARGET_B_INFLUX_BUCKET": "bk"}).targets[1]
    assert (b.config.influxdb.api, b.config.influxdb.bucket, b.config.influxdb.org) == (
        "v2",
        "bk",
        "o",
    )


@pytest.mark.parametrize(
    "var",
    [
        "TWOPHASE_TARGET_B_INFLUX_DATABASE",  # misspelt
        "TWOPHASE_TARGET_B_TARGET_URL",  # the URL is in TWOPHASE_TARGETS
        "TWOPHASE_TARGET_B_PROMOTION",  # the sink's, not one server's
        "TWOPHASE_TARGET_B_MIN_TARGETS",
        "TWOPHASE_TARGET_B_INFLUX_DB_FILE",  # _FILE is for secrets
        "TWOPHASE_TARGET_INFLUX_DB",  # no name
    ],
)
def test_a_target_variable_that_sets_nothing_is_refused(var: str) -> None:
    error = refused({**TWO, var: "x"})
    assert error.option == var and "is not a per-target setting" in error.problem


def test_per_target_settings_are_the_influx_ones_but_the_sinks() -> None:
    assert {"influx_db", "target_password", "influx_token", "influx_api"} <= set(PER_TARGET)
    sink_wide = {"target_url", "targets", "min_targets", "target_deadline", "target_max_lag"}
    assert not (sink_wide | {"promotion", "metrics_port", "staging_url"}) & set(PER_TARGET)


def test_targets_is_a_cli_flag() -> None:
    assert "targets" in CLI_FLAGS


TOML = """
staging_url = "postgresql+psycopg://tp:pg-s3cret@db.example:5432/tp"
influx_api = "v1"
influx_db = "metrics"
target_batch_points = 100
min_targets = 2
target_deadline = "2s"

[targets.a]
url = "http://influx-a:8086"

[targets.b]
url = "https://influx-b:8086"
influx_db = "metrics_b"
target_password = "file-s3cret"
"""


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "twophase.toml"
    path.write_text(text)
    return {"TWOPHASE_CONFIG": str(path)}


def test_a_toml_file_gives_settings_targets_and_overrides(tmp_path: Path) -> None:
    config = load_config(env=write(tmp_path, TOML))
    assert config.staging.display_url == "postgresql+psycopg://tp:***@db.example:5432/tp"
    influx = config.target
    assert (influx.batch_points, influx.min_targets, influx.target_deadline_s) == (100, 2, 2.0)
    a, b = influx.targets
    assert (a.name, a.config.url, a.config.influxdb.database) == (
        "a",
        "http://influx-a:8086",
        "metrics",
    )
    assert (b.name, b.config.url, b.config.influxdb.database) == (
        "b",
        "https://influx-b:8086",
        "metrics_b",
    )
    assert b.config.password == Secret("file-s3cret")
    assert "s3cret" not in repr(config)


def test_the_environment_and_explicit_values_win_over_the_file(tmp_path: Path) -> None:
    env = {**write(tmp_path, TOML), "TWOPHASE_TARGET_BATCH_POINTS": "7"}
    influx = load_config(env=env, min_targets=1).target
    assert (influx.batch_points, influx.min_targets) == (7, 1)
    assert influx.targets[1].config.influxdb.database == "metrics_b"
    env["TWOPHASE_TARGET_B_INFLUX_DB"] = "from_env"
    assert load_target_config(env=env).targets[1].config.influxdb.database == "from_env"


def test_targets_from_the_environment_replace_the_files_list_not_its_overrides(
    tmp_path: Path,
) -> None:
    targets = "b=https://other-b:8086,c=http://c:8086"  # b has a password: https
    env = {**write(tmp_path, TOML), "TWOPHASE_TARGETS": targets}
    b, c = load_target_config(env=env).targets
    assert (b.name, b.config.url, b.config.influxdb.database) == (
        "b",
        "https://other-b:8086",
        "metrics_b",
    )
    assert (c.name, c.config.influxdb.database) == ("c", "metrics")
    one = load_target_config(env={**env, "TWOPHASE_MIN_TARGETS": "1"}, target_url="http://one")
    assert (one.url, one.targets) == ("http://one", ())


def test_targets_may_be_a_string_in_the_file(tmp_path: Path) -> None:
    env = write(tmp_path, 'target_url = "http://one:8086"\ninflux_db = "m"\n')
    assert load_target_config(env=env).url == "http://one:8086"
    env = write(tmp_path, 'targets = "a=http://h1,b=http://h2"\ninflux_db = "m"\n')
    assert [t.name for t in load_target_config(env=env).targets] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('influx_databse = "x"\n', "influx_databse"),
        ('[targets.a]\nurl = "http://h"\ninflux_database = "x"\n', "targets.a.influx_database"),
        ('[targets.a]\nurl = "http://h"\npromotion = "inline"\n', "targets.a.promotion"),
        ("[targets.a]\ninflux_db = 'x'\n", "targets.a.url"),
        ("influx_db = ['a', 'b']\n", "influx_db"),
        ("target_timeout = true\n", "target_timeout"),
        ("targets = 3\n", "targets"),
    ],
)
def test_a_wrong_key_in_the_file_names_the_key_and_the_file(
    tmp_path: Path, text: str, key: str
) -> None:
    env = {**SHARED, **write(tmp_path, text)}
    error = refused(env)
    assert error.option == f"{key} in {tmp_path / 'twophase.toml'}"


def test_a_bad_value_in_the_file_names_the_key_and_the_file(tmp_path: Path) -> None:
    env = {**SHARED, **write(tmp_path, 'target_url = "http://u:hunter2@h"\n')}
    error = refused(env)
    assert error.option.startswith("target_url in ") and "hunter2" not in str(error)
    env = {**STAGING, **write(tmp_path, 'target_url = "http://h"\ninflux_api = "v1"\n')}
    assert refused(env).option == "TWOPHASE_INFLUX_DB"  # the check of the API, as ever


def test_url_and_targets_both_in_the_file_are_refused(tmp_path: Path) -> None:
    env = {**SHARED, **write(tmp_path, 'target_url = "http://h"\ntargets = "a=http://g"\n')}
    error = refused(env)
    assert error.option.startswith("targets in ") and "target_url in " in error.problem


@pytest.mark.parametrize(
    "text",
    [None, "staging_url = 'postgresql://u:s3cret@h/d\n", "= 'x'\n", "\x00"],
    ids=["missing", "unterminated", "no-key", "binary"],
)
def test_an_unreadable_or_invalid_file_names_twophase_config(
    tmp_path: Path, text: str | None
) -> None:
    path = tmp_path / "twophase.toml"
    if text is not None:
        path.write_text(text)
    error = refused({**SHARED, "TWOPHASE_CONFIG": str(path)})
    assert error.option == "TWOPHASE_CONFIG"
    assert "s3cret" not in str(error)

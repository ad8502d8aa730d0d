"""Fuzzing the configuration: any text in any setting either loads or fails with a
ConfigError naming that setting -- never another exception, never a secret in the
message; a malformed CLI flag exits 2 naming the flag."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz import any_text, examples
from twophase.cli import main
from twophase.config import BY_NAME, SETTINGS, load_config, load_setting
from twophase.errors import ConfigError

STAGING_PASSWORD = "pg-Secret-4711"
INFLUX_PASSWORD = "influx-Secret-0815"
TOKEN = "token-Secret-42"
URL_PASSWORD = "url-Secret-9"  # in URLs the test writes into the URL settings
SECRETS = (STAGING_PASSWORD, INFLUX_PASSWORD, TOKEN, URL_PASSWORD)
VALID = {
    "TWOPHASE_STAGING_URL": f"postgresql+psycopg://tp:{STAGING_PASSWORD}@db.example:5432/tp",
    "TWOPHASE_TARGET_URL": "https://influx.example:8086",  # credentials: not plain http
    "TWOPHASE_INFLUX_API": "v1",
    "TWOPHASE_INFLUX_DB": "metrics",
    "TWOPHASE_TARGET_USERNAME": "writer",
    "TWOPHASE_TARGET_PASSWORD": INFLUX_PASSWORD,
    "TWOPHASE_INFLUX_TOKEN": TOKEN,
}
# Text that looks like the values settings take, wrong in small ways, and anything at all.
near_values = st.one_of(
    any_text,
    st.from_regex(r"-?\d{0,25}(\.\d{0,5})?\s?(ms|s|m|h|d|w|x)?", fullmatch=True),
    st.sampled_from(["", " ", "0", "-1", "1e400", "nan", "v3", "auto ", "http://", "https://:1"]),
    st.sampled_from(["postgresql://", "mysql://u:p@h/d"]),
    st.from_regex(r"(postgresql(\+psycopg)?|https?|mysql)://[^\s]{0,30}", fullmatch=True),
    st.from_regex(r"(postgresql(\+psycopg)?|https?|mysql)://u:PW@[^\s]{0,20}", fullmatch=True).map(
        lambda url: url.replace("PW", URL_PASSWORD)
    ),
)


@settings(max_examples=examples(600))
@given(st.sampled_from(SETTINGS), near_values)
@example(BY_NAME["staging_url"], f"mysql://u:{URL_PASSWORD}@h/d")
@example(BY_NAME["target_url"], f"http://u:{URL_PASSWORD}@h:8086")
@example(BY_NAME["promote_connections"], "33")
@example(BY_NAME["target_url"], "A://[")  # found by the long profile
def test_a_malformed_setting_fails_naming_it_and_no_secret(setting: object, value: str) -> None:
    env = {**VALID, setting.env: value}  # type: ignore[attr-defined]
    try:
        load_config(env=env)
    except ConfigError as exc:
        assert exc.option == setting.env, (exc.option, str(exc))  # type: ignore[attr-defined]
        assert not any(secret in str(exc) for secret in SECRETS if secret not in value), str(exc)
        if setting.kind in ("staging_url", "http_url"):  # type: ignore[attr-defined]
            assert URL_PASSWORD not in str(exc), str(exc)  # a URL's password is masked
        assert exc.problem.strip()


@settings(max_examples=examples(300))
@given(st.dictionaries(st.sampled_from([s.env for s in SETTINGS]), near_values, max_size=6))
def test_several_malformed_settings_fail_naming_one_of_them(changes: dict[str, str]) -> None:
    try:
        load_config(env={**VALID, **changes})
    except ConfigError as exc:
        assert exc.option in changes, (exc.option, sorted(changes))
        assert not any(secret in str(exc) for secret in SECRETS[:3]), str(exc)


FLAGS = ("staging_url", "target_url", "influx_api")  # the flags whose values are checked


def refused(name: str, value: str) -> bool:
    try:
        load_setting(name, {}, **{name: value})
    except ConfigError:
        return True
    return False


@st.composite
def malformed_flags(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(FLAGS))
    value = draw(near_values.filter(lambda v: refused(name, v) and not v.startswith("-")))
    return name, value


@settings(max_examples=examples(150))
@given(malformed_flags())
def test_a_malformed_cli_flag_exits_2_naming_the_flag(flag: tuple[str, str]) -> None:
    name, value = flag
    out, err = io.StringIO(), io.StringIO()
    argv = ["--" + name.replace("_", "-"), value, "status"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    message = err.getvalue()
    assert code == 2, message
    last = message.splitlines()[-1]  # after a warning about a password in a flag, if any
    assert last.startswith("twophase: error: --" + name.replace("_", "-") + ":"), message
    assert "Traceback" not in message and out.getvalue() == ""
    assert not any(secret in message for secret in SECRETS)


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads TWOPHASE_* variables: the test's flags alone must decide."""
    import os

    for key in [k for k in os.environ if k.startswith("TWOPHASE_")]:
        monkeypatch.delenv(key)

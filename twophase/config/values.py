"""Reading one value of each kind of setting: text, secrets, durations, integers, choices,
URLs, lists of named InfluxDB targets and file paths.

Each parser takes the [`Setting`][twophase.config.settings.Setting], the raw value and the
name it was given under (the option, or its environment variable), and raises
[`ConfigError`][twophase.errors.ConfigError] naming that name. Secrets are wrapped in
[`Secret`][twophase.config.values.Secret], which never shows its value in ``repr``/``str``;
URLs are shown with the password masked.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import SplitResult, urlsplit

from twophase.config import urls
from twophase.config.settings import (
    TARGET_ENV_PREFIX,
    Setting,
    env_name,
    target_env_key,
    target_env_name,
)
from twophase.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# A target's name: it becomes part of variable names (TWOPHASE_TARGET_<NAME>_...) and of
# rows in the staging store, so it is kept to a portable alphabet.
TARGET_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class Secret:
    """A value that must never be printed: ``repr`` and ``str`` mask it."""

    _value: str = field(repr=False)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def parse_duration(text: str | float | int, option: str) -> float:
    """``'7d'``, ``'12h'``, ``'30m'``, ``'45s'``, ``'500ms'`` or a number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ConfigError(option, f"{text!r} is not a duration (examples: 500ms, 45s, 30m, 7d)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ConfigError(option, "must not be negative")
    return seconds


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for logs and errors)."""
    return urls.mask(url)


def _text(setting: Setting, raw: Any, name: str) -> str:
    return str(raw).strip()


def check_secret_text(text: str, name: str) -> None:
    """Refuse a secret holding a control character (a line break, a carriage return, a
    NUL): it cannot go into a header or a connection string, and the HTTP client's
    error would quote it. ConfigError naming ``name``, never the value."""
    if any(unicodedata.category(char) == "Cc" for char in text):
        raise ConfigError(
            name,
            "holds a control character (a line break, a carriage return, a tab...), which "
            "no password, token or URL may hold: write the secret on one line (the value "
            "is not shown)",
        )


def _secret(setting: Setting, raw: Secret, name: str) -> Secret:
    check_secret_text(raw.reveal(), name)
    return raw


def _bool(setting: Setting, raw: Any, name: str) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(name, f"{value!r} is not a boolean (true or false)")


def _duration(setting: Setting, raw: Any, name: str) -> float:
    seconds = parse_duration(raw, name)
    if setting.maximum is not None and seconds > setting.maximum:
        limit = setting.maximum
        raise ConfigError(name, f"must be at most {limit:.0f}s ({limit / 86400:g} days)")
    return seconds


def _int(setting: Setting, raw: Any, name: str) -> int:
    try:
        number = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(name, f"{raw!r} is not an integer") from None
    if number < setting.minimum:
        raise ConfigError(name, f"must be at least {setting.minimum}")
    if setting.maximum is not None and number > setting.maximum:
        raise ConfigError(name, f"must be at most {setting.maximum}")
    return number


def _choice(setting: Setting, raw: Any, name: str) -> str:
    value = str(raw).strip().lower()
    if value in setting.removed:  # taken by a former version: say so, not just "unknown"
        raise ConfigError(
            name,
            f"{value!r} was removed: {setting.name} is one of {', '.join(setting.choices)}",
        )
    if value not in setting.choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(setting.choices)}")
    return value


def _staging_url(setting: Setting, url: Secret, name: str) -> Secret:
    check_secret_text(url.reveal(), name)
    try:
        urls.DbUrl.parse(url.reveal()).check()
    except urls.BadUrl as exc:
        raise ConfigError(name, str(exc)) from None
    return url


def _http_url(setting: Setting, raw: Any, name: str) -> str:
    return _checked_http_url(str(raw), name, "", env_name)


def _target_url(parts: SplitResult) -> bool:
    """An http(s) URL with a host (InfluxDB), or the URL of another kind of target (its
    scheme tells the kind, checked when the sink opens: ``postgresql:///db`` may name no
    host, a socket then in its query)."""
    if parts.scheme in ("http", "https"):
        return bool(parts.hostname)
    return bool(_SCHEME.fullmatch(parts.scheme)) and parts.netloc + parts.path != ""


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def _checked_http_url(url: str, name: str, what: str, var: Callable[[str], str]) -> str:
    """``url`` if it is a target's URL (http(s) for InfluxDB, another scheme for another
    kind) without a password (in the user information or the query); ``what`` starts
    the message (which target), ``var`` names the variable of a setting for it (where
    the password or token belongs instead)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL" (an unclosed "["; found by fuzzing)
        raise ConfigError(name, f"{what}{mask_url(url)!r} is not an http(s) URL") from None
    if not _target_url(parts):
        raise ConfigError(name, f"{what}{mask_url(url)!r} is not an http(s) URL")
    if parts.password:
        raise ConfigError(name, f"{what}must not hold a password; use {var('target_password')}")
    secret = urls.DbUrl.parse(url).secret_params() if "?" in url else ()
    if secret:
        raise ConfigError(
            name,
            f"{what}must not hold a password or token in its query ({', '.join(secret)}=...): "
            f"use {var('target_password')} or {var('influx_token')}",
        )
    return url.rstrip("/")


def _targets(setting: Setting, raw: Any, name: str) -> tuple[tuple[str, str], ...]:
    """``a=http://h1:8086,b=https://h2:8086`` (or a mapping name -> URL, as the TOML
    file's ``[targets.NAME]`` tables give it): the (name, URL) pairs, in order."""
    pairs = _target_pairs(raw, name)
    if not pairs:
        raise ConfigError(name, "names no target: give name=http(s)://host:port, comma-separated")
    seen: dict[str, str] = {}
    checked = []
    for number, (target, url) in enumerate(pairs, 1):
        checked.append(_target(number, target, url, name))
        _check_unique(target, seen, name)
    return tuple(checked)


def _target_pairs(raw: Any, name: str) -> list[tuple[str, Any]]:
    if isinstance(raw, Mapping):
        return [(str(target), url) for target, url in raw.items()]
    if not str(raw).strip():
        return []
    pairs = []
    for number, entry in enumerate(str(raw).split(","), 1):
        target, equals, url = entry.strip().partition("=")
        if not equals:  # the entry may be a URL holding a password: shown masked
            shown = f" ({mask_url(entry.strip())!r})" if entry.strip() else " (empty)"
            raise ConfigError(name, f"entry {number}{shown} is not name=http(s)://host:port")
        pairs.append((target.strip(), url.strip()))
    return pairs


def _target(number: int, target: str, url: Any, name: str) -> tuple[str, str]:
    if not TARGET_NAME.fullmatch(target):
        # A name of plain characters is shown as it is; anything else masked with its URL:
        # "http://u:p=w@h" splits at the "=" inside the password.
        plain = re.fullmatch(r"[\w.-]*", target)
        shown = f"name {target!r}" if plain else repr(mask_url(f"{target}={url}"))
        raise ConfigError(
            name, f"entry {number} ({shown}): a target's name must match [a-z][a-z0-9_-]*"
        )
    var = partial(target_env_name, target)
    return target, _checked_http_url(str(url), name, f"target {target!r}: ", var)


def _check_unique(target: str, seen: dict[str, str], name: str) -> None:
    """Two targets may not share a name, nor the variables of their overrides."""
    key = target_env_key(target)
    if key not in seen:
        seen[key] = target
    elif seen[key] == target:
        raise ConfigError(name, f"target {target!r} is named twice")
    else:
        raise ConfigError(
            name,
            f"targets {seen[key]!r} and {target!r} would share the variables "
            f"{TARGET_ENV_PREFIX}{key}_*: rename one",
        )


def _path(setting: Setting, raw: Any, name: str) -> str:
    path = str(raw).strip()
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigError(name, f"{path!r} is not a readable file")
    return path


_PARSERS: dict[str, Callable[[Setting, Any, str], Any]] = {
    "text": _text,
    "secret": _secret,
    "duration": _duration,
    "int": _int,
    "bool": _bool,
    "choice": _choice,
    "staging_url": _staging_url,
    "http_url": _http_url,
    "targets": _targets,
    "path": _path,
}


def parse(setting: Setting, raw: Any, name: str) -> Any:
    """``raw`` read as the setting's kind; a ConfigError naming ``name`` when it is not one."""
    return _PARSERS[setting.kind](setting, raw, name)

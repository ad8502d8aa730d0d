"""Reading one value of each kind of setting: text, secrets, durations, integers, choices,
URLs and file paths.

Each parser takes the :class:`~twophase.config.settings.Setting`, the raw value and
the name it was given under (the option, or its environment variable), and raises
:class:`~twophase.errors.ConfigError` naming that name. Secrets are wrapped in
:class:`Secret`, which never shows its value in ``repr``/``str``; URLs are shown
with the password masked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twophase.config import urls
from twophase.config.settings import Setting
from twophase.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


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


def _secret(setting: Setting, raw: Secret, name: str) -> Secret:
    return raw


def _duration(setting: Setting, raw: Any, name: str) -> float:
    return parse_duration(raw, name)


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
    if value not in setting.choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(setting.choices)}")
    return value


def _staging_url(setting: Setting, url: Secret, name: str) -> Secret:
    try:
        urls.DbUrl.parse(url.reveal()).check()
    except urls.BadUrl as exc:
        raise ConfigError(name, str(exc)) from None
    return url


def _http_url(setting: Setting, raw: Any, name: str) -> str:
    url = str(raw)
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL" (an unclosed "["; found by fuzzing)
        raise ConfigError(name, f"{mask_url(url)!r} is not an http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(name, f"{mask_url(url)!r} is not an http(s) URL")
    if parts.password:
        raise ConfigError(name, "must not hold a password; use TWOPHASE_INFLUX_PASSWORD")
    return url.rstrip("/")


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
    "choice": _choice,
    "staging_url": _staging_url,
    "http_url": _http_url,
    "path": _path,
}


def parse(setting: Setting, raw: Any, name: str) -> Any:
    """``raw`` read as the setting's kind; a ConfigError naming ``name`` when it is not one."""
    return _PARSERS[setting.kind](setting, raw, name)

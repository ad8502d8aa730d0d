"""Loading settings: explicit values first, then ``TWOPHASE_*`` environment variables,
then the TOML file ``TWOPHASE_CONFIG`` names, then the table's defaults.

Every error names the option (the environment variable when the value came from
there, ``option in /path/file.toml`` when from the file). A secret may also be
given as ``<VAR>_FILE`` naming a file that holds it. A sink's targets
are ``target_url`` (one) or ``targets`` (several, each of which may override
the shared settings: ``TWOPHASE_TARGET_<NAME>_<OPTION>`` or the file's
``[targets.NAME]``). Everything is parsed and validated once, when loaded. Two
targets may not write to the same database (or bucket) of the same server.

A setting's former names (its ``aliases``: ``influx_url`` of ``target_url``) are
read wherever its name is, and errors then name what the user set. One source
giving a setting under two of its names with different values is an error naming
both; the same value twice is not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from twophase.config.files import NO_FILE, ConfigFile, read_config_file
from twophase.config.sections import (
    ExporterConfig,
    NamedTarget,
    StagingConfig,
    TargetConfig,
    TwoPhaseConfig,
)
from twophase.config.settings import (
    BY_NAME,
    EXPORTER,
    OPTIONS,
    PER_TARGET,
    SETTINGS,
    STAGING,
    TARGET_ENV_PREFIX,
    TARGET_SECTIONS,
    Setting,
    env_name,
    target_env_name,
)
from twophase.config.urls import is_loopback
from twophase.config.values import Secret, check_secret_text, mask_url, parse
from twophase.errors import ConfigError

# Where a value was found; the first of them wins.
_EXPLICIT, _ENVIRONMENT, _FILE, _UNSET = range(4)
_SERVERS = ("target_url", "targets")  # one server or several: exactly one of them is set
Targets = tuple[tuple[str, str], ...]  # (name, URL) pairs, as the targets setting parses
# Where a target's points land on its server: ("database", name, retention policy) or
# ("bucket", org, bucket). See `_destinations`.
Destination = tuple[str, str, str | None]
_DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432}
# TWOPHASE_TARGET_<NAME>_<OPTION>[_FILE]: the shape of every per-target variable (an
# option's aliases included).
_TARGET_VAR = re.compile(
    rf"{TARGET_ENV_PREFIX}[A-Z0-9_]+?_"
    rf"({'|'.join(n.upper() for o in PER_TARGET for n in BY_NAME[o].names)})(_FILE)?"
)
Given = tuple[Any, str]  # a raw value (None: unset) and the name it was given under


class _Source:
    """Looks a setting up in explicit values, then the environment, then the file, and
    parses it. With ``target``, the source of that target's overrides: its variables
    (``TWOPHASE_TARGET_<NAME>_<OPTION>``) and its ``[targets.NAME]`` table."""

    def __init__(
        self,
        explicit: Mapping[str, Any],
        env: Mapping[str, str],
        file: ConfigFile = NO_FILE,
        target: str | None = None,
    ) -> None:
        self._explicit = {k: v for k, v in explicit.items() if v is not None}
        self.env = env
        self.file = file
        self._values = file.target(target) if target else file.settings
        self.var: Callable[[str], str] = partial(target_env_name, target) if target else env_name

    def for_target(self, name: str) -> _Source:
        return _Source({}, self.env, self.file, name)

    def rank(self, option: str) -> int:
        """Where the option is set (under any of its names): explicitly, in the
        environment, in the file, or not."""
        names = BY_NAME[option].names
        if any(name in self._explicit for name in names):
            return _EXPLICIT
        if any(self.env.get(self.var(name)) for name in names):
            return _ENVIRONMENT
        return _FILE if any(self._values.get(n)[0] is not None for n in names) else _UNSET

    def lookup(self, setting: Setting) -> Given:
        """The raw value (None when unset; a secret as [`Secret`][twophase.config.values.Secret])
        and the name it was given under (an alias's if the user gave that; the variable's
        when unset). ConfigError when one source gives two of its names different values."""
        for given in (self._explicit_given, self._env_given, self._file_given):
            raw, name = _one_of(given(setting))
            if raw is not None:
                return _wrap(setting, raw), name
        return None, self.var(setting.name)

    def _explicit_given(self, setting: Setting) -> list[Given]:
        return [(self._explicit.get(name), name) for name in setting.names]

    def _env_given(self, setting: Setting) -> list[Given]:
        found = []
        for var in map(self.var, setting.names):
            raw = self.env.get(var) or (self._secret_file(var) if _is_secret(setting) else None)
            found.append((raw, var))
        return found

    def _file_given(self, setting: Setting) -> list[Given]:
        return [self._values.get(name) for name in setting.names]

    def value(self, setting: Setting) -> Any:
        """The parsed value, the table's default when unset; ConfigError naming it."""
        raw, name = self.lookup(setting)
        if raw is None:
            if setting.required:
                raise ConfigError(name, "is required but not set")
            return setting.default
        return parse(setting, raw, name)

    def _secret_file(self, var: str) -> str | None:
        file_var = var + "_FILE"
        path = self.env.get(file_var)
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise ConfigError(file_var, f"cannot read the file it names ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ConfigError(file_var, "the file it names is not UTF-8 text") from None
        return _file_secret(text, file_var)


def _one_of(found: list[Given]) -> Given:
    """The value given under the first of a setting's names that has one, once the others
    agree with it (as written: ``10s`` and ``10`` differ); (None, "") when none has."""
    given = [(raw, name) for raw, name in found if raw is not None]
    if not given:
        return None, ""
    (raw, name), *others = given
    for other, other_name in others:
        if _plain(other) != _plain(raw):  # compared, never shown: it may be a secret
            raise ConfigError(
                name,
                f"is set together with {other_name}, its former name, to a different "
                f"value: set only {name}",
            )
    return raw, name


def _plain(raw: Any) -> Any:
    value = raw.reveal() if isinstance(raw, Secret) else raw
    return value.strip() if isinstance(value, str) else value


def _file_secret(text: str, file_var: str) -> str:
    """The secret a ``*_FILE`` holds: its text without the whitespace around it (the
    final line break an editor or ``echo`` adds, say). An empty file, and a secret
    holding a control character (a second line, a carriage return), are refused
    naming ``file_var``: never a secret the server would refuse, nor a header value
    whose error quotes the secret."""
    secret = text.strip()
    if not secret:
        raise ConfigError(file_var, "the file it names is empty: it must hold the secret")
    check_secret_text(secret, file_var)
    return secret


def _is_secret(setting: Setting) -> bool:
    return setting.secret or setting.kind == "staging_url"  # a URL may hold a password


def _wrap(setting: Setting, raw: Any) -> Any:
    if raw is None or not _is_secret(setting) or isinstance(raw, Secret):
        return raw
    return Secret(str(raw))


def _source(env: Mapping[str, str] | None, explicit: Mapping[str, Any]) -> _Source:
    environ = os.environ if env is None else env
    return _Source(explicit, environ, read_config_file(environ))


def _staging(src: _Source) -> StagingConfig:
    return StagingConfig(**{s.attr: src.value(s) for s in SETTINGS if s.section == STAGING})


def _target_config(src: _Source) -> TargetConfig:
    url, pairs = _servers(src)
    shared = TargetConfig(url=url).with_settings(_shared_fields(src))
    if pairs:
        _check_target_variables(src.env)
    targets = tuple(_target(src.for_target(name), shared, name, at) for name, at in pairs)
    config = replace(shared, targets=targets)
    _check_distinct_destinations(src, targets)
    _check_min_targets(src, config)
    # With targets, each target is checked (its own API may differ); the shared
    # settings alone need not make a whole server's.
    if not targets and config.influxdb.api != "auto" and config.is_influx:
        config.influxdb.validate_for_api()
    _check_plaintext_credentials(src, config)
    return config


def _shared_fields(src: _Source) -> dict[str, dict[str, Any]]:
    """The targets' settings but the servers (read by `_servers`), by section and field."""
    values: dict[str, dict[str, Any]] = {section: {} for section in TARGET_SECTIONS}
    for setting in SETTINGS:
        if setting.section in TARGET_SECTIONS and setting.name not in _SERVERS:
            values[setting.section][setting.attr] = src.value(setting)
    return values


def _servers(src: _Source) -> tuple[str, Targets]:
    """The URL and the targets (none with ``target_url``; with ``targets`` the URL is the
    first target's). The first source that sets either decides, so an explicit value
    or a variable replaces what the file says; both in one source is an error."""
    url_at, targets_at = src.rank("target_url"), src.rank("targets")
    if url_at == targets_at:
        _refuse_both_or_neither(src, url_at)
    if url_at < targets_at:
        return src.value(BY_NAME["target_url"]), ()
    pairs: Targets = src.value(BY_NAME["targets"])
    return pairs[0][1], pairs


def _refuse_both_or_neither(src: _Source, where: int) -> None:
    url, targets = env_name("target_url"), env_name("targets")
    if where == _UNSET:
        raise ConfigError(url, f"is required but not set (or {targets}, for several servers)")
    raise ConfigError(
        src.lookup(BY_NAME["targets"])[1],
        f"is set together with {src.lookup(BY_NAME['target_url'])[1]}: set only one "
        f"({url} for one target, {targets} for several)",
    )


def _target(src: _Source, shared: TargetConfig, name: str, url: str) -> NamedTarget:
    """One target: the shared settings with its URL and overrides, checked like them;
    errors name its own variables."""
    overrides: dict[str, dict[str, Any]] = {section: {} for section in TARGET_SECTIONS}
    for setting in (BY_NAME[option] for option in PER_TARGET):
        raw, given = src.lookup(setting)
        if raw is not None:
            overrides[setting.section][setting.attr] = parse(setting, raw, given)
    try:
        config = replace(shared, url=url, targets=()).with_settings(overrides)
        if config.influxdb.api != "auto" and config.is_influx:
            config.influxdb.validate_for_api()
    except ConfigError as exc:
        raise _for_target(exc, name) from None
    return NamedTarget(name, config)


def _for_target(exc: ConfigError, name: str) -> ConfigError:
    """A shared setting's error as one target's: the target's own variable fixes it for
    that target, the shared one for all."""
    option = next(
        (n for o in PER_TARGET for n in BY_NAME[o].names if env_name(n) == exc.option), None
    )
    if option is None:
        return ConfigError(exc.option, f"{exc.problem} (target {name!r})")
    return ConfigError(
        target_env_name(name, option),
        f"{exc.problem} for target {name!r} (or {exc.option} for every target)",
    )


def _check_target_variables(env: Mapping[str, str]) -> None:
    """Refuse a ``TWOPHASE_TARGET_*`` variable that can set nothing: a typo
    (``..._INFLUX_DATABASE``) or a sink-wide setting would otherwise be ignored in
    silence. Those of targets this sink lacks are left alone: another sink of the
    same process may have them."""
    # Every setting's own variables (TWOPHASE_TARGET_URL, TWOPHASE_TARGET_PASSWORD_FILE).
    settings = {env_name(n) for s in SETTINGS for n in s.names}
    settings |= {env_name(n) + "_FILE" for s in SETTINGS if s.secret for n in s.names}
    for var in sorted(env):
        if not var.startswith(TARGET_ENV_PREFIX) or var in settings:
            continue
        match = _TARGET_VAR.fullmatch(var)
        if match is None or (match.group(2) and not BY_NAME[match.group(1).lower()].secret):
            raise ConfigError(
                var,
                f"is not a per-target setting: {TARGET_ENV_PREFIX}<NAME>_<OPTION> (NAME upper "
                f"case, - as _; <OPTION>_FILE for a secret) sets one of {', '.join(PER_TARGET)} "
                f"for one target; its URL is in {env_name('targets')}",
            )


def _check_plaintext_credentials(src: _Source, config: TargetConfig) -> None:
    """Refuse a target whose password or token would cross the network unencrypted:
    an ``http://`` URL of a host that is not loopback, with credentials, unless
    ``allow_plaintext_credentials`` is true for it. The error names the URL's setting,
    the target and the setting that allows it; never a secret."""
    allow = env_name("allow_plaintext_credentials")
    for target in config.named_targets():
        one = target.config
        if one.allow_plaintext_credentials or not _plaintext_remote(one.url):
            continue
        secrets = (("a password", one.password), ("a token", one.influxdb.token))
        what = [word for word, secret in secrets if secret is not None]
        if not what:
            continue
        if config.targets:
            own = target_env_name(target.name, "allow_plaintext_credentials")
            shown = f"target {target.name!r} ({mask_url(one.url)})"
            fix = f"{own}=true for it (or {allow}=true for every target)"
        else:
            shown, fix = mask_url(one.url), f"{allow}=true"
        verb = "are" if len(what) > 1 else "is"
        raise ConfigError(
            src.lookup(BY_NAME["targets" if config.targets else "target_url"])[1],
            f"{shown} is plain http and {' and '.join(what)} {verb} configured for it: the "
            f"credentials would cross the network unencrypted. Use https://, or set {fix} "
            "to send them anyway (on a network you trust)",
        )


def _plaintext_remote(url: str) -> bool:
    """Whether ``url`` is plain http to a host that may be across a network: not
    loopback (127.0.0.0/8, ::1, localhost), where nothing leaves the machine."""
    parts = urlsplit(url)
    return parts.scheme.lower() == "http" and not is_loopback(parts.hostname or "")


def _check_distinct_destinations(src: _Source, targets: tuple[NamedTarget, ...]) -> None:
    """Refuse two targets that write to the same database (or bucket) of the same server.
    Both would hold the same series, and a lagging one's catch-up, delivering old epochs
    in order, would write old values over the newer ones the other already wrote."""
    seen: dict[tuple[str, Destination], NamedTarget] = {}
    for target in targets:
        server = server_of(target.config.url)
        for destination in _destinations(target.config):
            other = seen.setdefault((server, destination), target)
            if other is not target:
                raise _same_destination(src, other, target, server, destination)


def _same_destination(
    src: _Source, first: NamedTarget, second: NamedTarget, server: str, where: Destination
) -> ConfigError:
    kind, name, detail = where
    if kind == "schema":
        shown = f"schema {name!r}"
    elif kind == "database":
        shown = f"db {name!r}" + (f", retention policy {detail!r}" if detail else "")
    else:
        shown = f"bucket {detail!r} of org {name!r}"
    auto = " (with influx_api auto the server's version decides which is written to)"
    either_auto = kind != "schema" and "auto" in (
        first.config.influxdb.api,
        second.config.influxdb.api,
    )
    return ConfigError(
        src.lookup(BY_NAME["targets"])[1],
        f"targets {first.name!r} and {second.name!r} write to the same server and {kind} "
        f"({mask_url(server)}, {shown}){auto if either_auto else ''}: a lagging one's catch-up "
        f"would write old values over the other's newer ones; give each its own {kind} or "
        "server",
    )


def server_of(url: str) -> str:
    """The URL as compared: scheme and host in lower case, the port filled in, the path
    without a trailing slash; no user (a server's data is the same whoever writes it),
    query or fragment. Host names are compared as written, not resolved: resolving at
    load time would be slow, could fail or change, and would still miss a server known
    by two names (a proxy, a CNAME); so ``localhost`` and ``127.0.0.1`` differ here."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6
    try:
        port = str(parts.port or _DEFAULT_PORTS.get(parts.scheme.lower()))
    except ValueError:  # not a number: compared as written
        port = parts.netloc.rpartition(":")[2]
    return f"{parts.scheme.lower()}://{host}:{port}{parts.path.rstrip('/')}"


def _destinations(config: TargetConfig) -> set[Destination]:
    """Where the target's points may land, by its API: the database and retention
    policy (1.x; 3 has no retention policy and takes 1.x writes into the same
    database), the org and bucket (2.x), either for ``auto`` (the server's version
    picks). A different retention policy is different storage; none (the database's
    default) is taken as different from a named one, as which is the default is the
    server's to say. A field the API needs but lacks gives nothing: the check of the
    API refuses it. How a 2.x or 3 server maps a database to a bucket is not known
    here either. A target of another kind lands in the schema (``target_schema``) of
    the database its URL names."""
    found: set[Destination] = set()
    if not config.is_influx:  # another kind: its URL names the database; the schema
        return {("schema", config.postgresql.schema, None)}
    influx = config.influxdb
    if influx.api in ("v1", "v3", "auto") and influx.database:
        policy = influx.retention_policy if influx.api != "v3" else None
        found.add(("database", influx.database, policy or None))
    if influx.api in ("v2", "auto") and influx.bucket and influx.org:
        found.add(("bucket", influx.org, influx.bucket))
    return found


def _check_min_targets(src: _Source, config: TargetConfig) -> None:
    count = len(config.named_targets())
    if config.min_targets > count:
        raise ConfigError(
            src.lookup(BY_NAME["min_targets"])[1],
            f"is {config.min_targets}, more than the {count} target(s) configured",
        )


def load_setting(name: str, env: Mapping[str, str] | None = None, **explicit: Any) -> Any:
    """One setting's value, parsed (for a process that has only some of the settings:
    an executor knows the staging store, maybe not the targets)."""
    return _source(env, explicit).value(BY_NAME[name])


def load_staging_config(env: Mapping[str, str] | None = None, **explicit: Any) -> StagingConfig:
    """The staging store settings (for processes that never talk to a target)."""
    return _staging(_source(env, explicit))


def load_exporter_config(env: Mapping[str, str] | None = None, **explicit: Any) -> ExporterConfig:
    """The exporter's settings (``exporter_*``): where ``twophase metrics serve`` listens,
    its TLS, how long a read of the store answers scrapes."""
    src = _source(env, explicit)
    return ExporterConfig(**{s.attr: src.value(s) for s in SETTINGS if s.section == EXPORTER})


def load_target_config(env: Mapping[str, str] | None = None, **explicit: Any) -> TargetConfig:
    """The targets' settings; ``influx_api`` may still be ``auto`` afterwards."""
    return _target_config(_source(env, explicit))


def load_config(env: Mapping[str, str] | None = None, **explicit: Any) -> TwoPhaseConfig:
    """Parse and validate everything once. Keyword names are option names
    (``staging_url``, ``target_url``, ``targets``, ``influx_db``, ...) or their
    aliases (``influx_url``); each falls back to ``TWOPHASE_<NAME>`` in ``env``
    (default: ``os.environ``), then to the TOML file ``TWOPHASE_CONFIG`` names."""
    unknown = sorted(set(explicit) - set(BY_NAME))
    if unknown:
        raise ConfigError(unknown[0], f"unknown option (known: {', '.join(OPTIONS)})")
    src = _source(env, explicit)
    return TwoPhaseConfig(staging=_staging(src), target=_target_config(src))

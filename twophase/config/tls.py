"""TLS failures as configuration errors naming the setting to fix.

A certificate that is not trusted, a host name it does not cover, a client
certificate a server wants or refuses: retrying cannot help, so each becomes a
[`ConfigError`][twophase.errors.ConfigError] (permanent: raised at once, not after a
retry deadline) whose option is the setting to look at. The TLS files
themselves are settings (``staging_tls_*``, ``target_tls_*``, [`twophase.config`][twophase.config]).
"""

from __future__ import annotations

import re

from twophase.config.settings import env_name
from twophase.errors import ConfigError

# (what the client library says, the setting to fix, what to do) -- libpq's messages
# for PostgreSQL, OpenSSL's (through ssl/urllib3) for InfluxDB. First match wins.
_Rule = tuple[re.Pattern[str], str, str]
_STAGING: tuple[_Rule, ...] = (
    (
        re.compile(r"does not match host name|certificate.*not valid for", re.I),
        "staging_url",
        "the server's certificate does not name the host in the URL: connect by a name the "
        "certificate lists, or have a certificate issued for this one",
    ),
    (
        re.compile(r"private key file|sslkey", re.I),
        "staging_tls_key",
        "the client key cannot be used (unreadable, wrong format, or readable by others: "
        "libpq wants mode 0600)",
    ),
    (
        re.compile(r"certificate verify failed|root certificate|sslrootcert|self.signed", re.I),
        "staging_tls_ca",
        "the server's certificate is not signed by this CA (without one, by one of the "
        "system's CAs), or the file holds none: give the CA that signed it",
    ),
    (
        re.compile(
            r"requires a valid client certificate|certificate authentication failed|"
            r"no client certificate",
            re.I,
        ),
        "staging_tls_cert",
        "the server wants a client certificate it trusts: set it and its key",
    ),
    (
        re.compile(
            r"alert (unknown ca|bad certificate|certificate unknown)|"
            r"certificate (file|unknown)|sslcert",
            re.I,
        ),
        "staging_tls_cert",
        "the server does not accept the client certificate (not signed by a CA it trusts?)",
    ),
    (
        re.compile(r"server does not support SSL|no encryption|SSL off", re.I),
        "staging_url",
        "TLS is required on one side and not offered on the other: check sslmode in the URL "
        "and the server's ssl setting",
    ),
)
_INFLUX: tuple[_Rule, ...] = (
    (
        re.compile(r"hostname mismatch|ip address mismatch|doesn't match", re.I),
        "target_url",
        "the server's certificate does not name the host in the URL: connect by a name the "
        "certificate lists",
    ),
    (
        re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.I),
        "target_tls_ca",
        "the server's certificate is not signed by a trusted CA: give the CA that signed it",
    ),
    (
        re.compile(r"alert (unknown ca|bad certificate|certificate required)", re.I),
        "target_tls_cert",
        "the server does not accept the client certificate (or wants one)",
    ),
    (
        re.compile(r"PEM lib|key values mismatch|KEY_VALUES_MISMATCH", re.I),
        "target_tls_key",
        "the client certificate and key cannot be loaded together",
    ),
    (
        re.compile(r"WRONG_VERSION_NUMBER|wrong version number", re.I),
        "target_url",
        "the server does not speak TLS on this port: use http://, or the server's https port",
    ),
)


def staging_tls_error(message: str) -> ConfigError | None:
    """The ConfigError for a failed PostgreSQL connection when TLS is why; else None."""
    return _match(_STAGING, message)


def influx_tls_error(message: str) -> ConfigError | None:
    """The ConfigError for a failed InfluxDB request when TLS is why; else None."""
    return _match(_INFLUX, message)


def _match(rules: tuple[_Rule, ...], message: str) -> ConfigError | None:
    for pattern, setting, advice in rules:
        if pattern.search(message):
            return ConfigError(env_name(setting), f"{advice} ({_short(message)})")
    return None


def _short(message: str, limit: int = 300) -> str:
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

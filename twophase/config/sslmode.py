"""The staging store's TLS when its URL does not choose: verified, to any host not loopback.

libpq's own default, ``sslmode=prefer``, tries TLS without checking the
server's certificate and falls back to plain text in silence: across a network,
anyone on the path could read what crosses it (every staged point) or stand in
for the server and take the password. So a URL that names a host that is neither
loopback (``127.0.0.0/8``, ``::1``, ``localhost``) nor a Unix socket, and that
does not choose an ``sslmode`` itself (in its query, or libpq's ``PGSSLMODE``),
gets ``sslmode=verify-full``: the certificate must be signed by a CA trusted
here and name the host. The CA is ``staging_tls_ca`` when given (for any host,
as before), else one libpq is told of (``sslrootcert``, ``PGSSLROOTCERT``,
``~/.postgresql/root.crt``), else the system's trusted roots.

A weaker ``sslmode`` chosen for such a host is honoured, and logged as a
warning once per process and URL (the URL masked). Loopback hosts and sockets
keep libpq's default: nothing they carry leaves the machine.

The hosts the URL names decide, not its ``hostaddr``: the certificate is checked
against the host name even when ``hostaddr`` says where to connect.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from twophase.config import urls
from twophase.config.settings import env_name

log = logging.getLogger(__name__)

VERIFY_FULL = "verify-full"
# Modes that leave the connection readable or the server unauthenticated: plain text
# allowed (disable, allow, prefer), or a certificate not checked (require) or checked
# without its host name (verify-ca).
WEAK_MODES = ("disable", "allow", "prefer", "require", "verify-ca")
# The libpq version that reads sslrootcert=system (16.0).
SYSTEM_ROOTS_LIBPQ = 160000

_warned: set[str] = set()
_warned_lock = threading.Lock()


def tls_params(
    hosts: str,
    params: Mapping[str, str],
    tls_ca: str | None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The libpq parameters twophase adds to a URL whose authority names ``hosts`` (as
    written: ``h1:5432,[::1]:5433``) and whose query holds ``params``: ``sslmode``
    unless the URL (or ``PGSSLMODE``) chooses one, and the system's roots as
    ``sslrootcert`` when the certificate is to be verified and no CA is given. ``env``
    is the process's environment (libpq's variables)."""
    environ = os.environ if env is None else env
    added: dict[str, str] = {}
    chosen = params.get("sslmode") or environ.get("PGSSLMODE")
    if not chosen and (tls_ca or remote_hosts(hosts, params, environ)):
        added["sslmode"] = chosen = VERIFY_FULL  # else loopback or a socket: libpq's default
    # A mode that checks the certificate, and no CA: the system's (libpq's own default
    # is a file in the home folder, an error when absent).
    verifying = chosen in (VERIFY_FULL, "verify-ca")
    if verifying and not tls_ca and not _ca_known_to_libpq(params, environ):
        added["sslrootcert"] = system_roots()
    return added


def weak_mode(hosts: str, params: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """The weak ``sslmode`` the URL (or ``PGSSLMODE``) chooses for a host that is not
    loopback; empty when there is none to warn of."""
    environ = os.environ if env is None else env
    mode = params.get("sslmode") or environ.get("PGSSLMODE", "")
    if mode not in WEAK_MODES or not remote_hosts(hosts, params, environ):
        return ""
    return mode


def warn_weak_mode(shown_url: str, hosts: str, params: Mapping[str, str]) -> None:
    """Log, once per process and URL, that the URL's weak ``sslmode`` is honoured for a
    host that is not loopback. ``shown_url`` is the URL as it may be shown (masked)."""
    mode = weak_mode(hosts, params)
    if not mode:
        return
    with _warned_lock:
        if shown_url in _warned:
            return
        _warned.add(shown_url)
    where = ", ".join(remote_hosts(hosts, params, os.environ))
    risk = "may be plain text" if mode in ("disable", "allow", "prefer") else "is not verified"
    log.warning(
        "%s: %s chooses sslmode=%s (in its query or PGSSLMODE) for %s, which is not "
        "loopback: the connection %s. Without an sslmode it is verify-full (the server's "
        "certificate checked against the system's CAs, or %s); keep the weaker one only "
        "on a network you trust",
        env_name("staging_url"),
        shown_url,
        mode,
        where,
        risk,
        env_name("staging_tls_ca"),
    )


def remote_hosts(hosts: str, params: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The hosts libpq will connect to that are neither loopback nor a Unix socket: the
    query's ``host`` (which wins over the authority's), else the authority's; when the
    URL names none, its ``hostaddr`` and libpq's ``PGHOST`` and ``PGHOSTADDR``; none at
    all is libpq's default socket."""
    names = params.get("host") or ",".join(_authority_hosts(hosts))
    if not names:
        defaults = (params.get("hostaddr"), env.get("PGHOST"), env.get("PGHOSTADDR"))
        names = ",".join(name for name in defaults if name)
    return [name for name in (n.strip() for n in names.split(",")) if not is_local(name)]


def is_local(host: str) -> bool:
    """Whether nothing sent to ``host`` leaves the machine: a Unix socket (a folder, or
    Linux's abstract ``@name``; empty: libpq's default socket) or a loopback host
    (127.0.0.0/8, ::1 and IPv4-mapped 127.x, ``localhost``). A name is not resolved:
    it may resolve to anything later, so only ``localhost`` counts."""
    if not host or host.startswith(("/", "@")):
        return True
    return urls.is_loopback(host)


def system_roots() -> str:
    """What ``sslrootcert`` names for the system's trusted CAs.

    The bundle file Python's OpenSSL reads (Debian's
    ``/etc/ssl/certs/ca-certificates.crt``; ``SSL_CERT_FILE`` when set), rather than
    libpq's ``sslrootcert=system``: the psycopg-binary wheel's libpq carries an
    OpenSSL of its own whose "system" roots are a folder of its build
    (``/usr/lib/psycopg-openssl``), empty on the machine, so ``system`` would trust
    nothing there. Without such a file: ``system`` where libpq reads it (16 and
    later), else OpenSSL's default file, whose absence libpq reports as a missing root
    certificate (the error names ``staging_tls_ca``)."""
    # Imported here, as psycopg below: every executor's Python worker reads the
    # configuration, and most never verify a certificate (importing ssl is not free:
    # the cold start the `pipelines` bench scenario times).
    import ssl

    paths = ssl.get_default_verify_paths()
    if paths.cafile:
        return paths.cafile
    import psycopg

    return "system" if psycopg.pq.version() >= SYSTEM_ROOTS_LIBPQ else paths.openssl_cafile


def _authority_hosts(hosts: str) -> list[str]:
    """The host of each ``host[:port]`` of a URL's authority, decoded (a socket folder
    is written ``%2Frun%2Fpg``), without an IPv6 address's brackets."""
    found = []
    for entry in hosts.split(","):
        if entry.startswith("["):
            found.append(entry[1:].partition("]")[0])
        else:
            found.append(unquote(entry.rpartition(":")[0] if ":" in entry else entry))
    return found


def _ca_known_to_libpq(params: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """Whether libpq already has a CA to check against: the URL's ``sslrootcert``,
    ``PGSSLROOTCERT``, or its default file ``~/.postgresql/root.crt`` when present."""
    if params.get("sslrootcert") or env.get("PGSSLROOTCERT"):
        return True
    home = os.path.expanduser("~")  # "~" as it is when there is no home (a bare container)
    return home != "~" and (Path(home) / ".postgresql" / "root.crt").is_file()

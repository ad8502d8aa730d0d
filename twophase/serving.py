"""Prometheus endpoints: a registry served over http, or https by prometheus_client's own TLS.

Both endpoints of twophase are served here, so that they listen, speak TLS and
fail alike: the exporter of the store (``twophase metrics serve``,
``exporter_*`` settings) and the driver's metrics of its requests to the targets
(``metrics_port``, ``metrics_*``). Each listens on its ``*_host`` (loopback
unless told); with ``*_tls_cert`` and ``*_tls_key`` it speaks https only, and
with ``*_tls_client_ca`` it also wants a client certificate that CA signed
(mutual TLS). The TLS context is prometheus_client's (``start_http_server``'s
``certfile``, ``keyfile``, ``client_cafile``, ``client_auth_required``).

A setting that cannot work (an address this host does not have, a port in use,
a certificate and key that do not belong together) is a
[`ConfigError`][twophase.errors.ConfigError] naming it, raised before anything listens.
"""

from __future__ import annotations

import errno
import logging
import ssl
import sys
import threading
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from twophase.config import EndpointConfig, env_name
from twophase.errors import ConfigError

log = logging.getLogger("twophase.serving")

# A connection's TLS handshake and request must come within this; an idle client holds
# its own thread that long, and nothing else.
CONNECTION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Served:
    """A running endpoint: prometheus_client's server and its thread."""

    server: Any
    thread: threading.Thread
    endpoint: EndpointConfig

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        """Where to scrape it (an IPv6 address in brackets)."""
        host = self.endpoint.host
        shown = f"[{host}]" if ":" in host else host
        return f"{self.endpoint.scheme}://{shown}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(registry: CollectorRegistry, endpoint: EndpointConfig) -> Served:
    """Serve ``registry`` at ``/metrics`` on the endpoint, from a daemon thread."""
    tls = _tls_arguments(endpoint)
    try:
        server, thread = start_http_server(
            endpoint.port, addr=endpoint.host, registry=registry, **tls
        )
    except OSError as exc:
        raise _bind_error(endpoint, exc) from None
    _harden(server, endpoint)
    return Served(server, thread, endpoint)


def _tls_arguments(endpoint: EndpointConfig) -> dict[str, Any]:
    """prometheus_client's TLS arguments, the files checked first: it loads them only
    once its socket is bound, and a failure then would leave the port taken."""
    if not endpoint.tls_cert:
        return {}
    prefix = endpoint.prefix
    check = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        check.load_cert_chain(endpoint.tls_cert, endpoint.tls_key)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            env_name(f"{prefix}_tls_cert"),
            f"{endpoint.tls_cert} and {env_name(f'{prefix}_tls_key')} ({endpoint.tls_key}) are "
            f"not a certificate and its private key in PEM: {exc}",
        ) from None
    arguments: dict[str, Any] = {"certfile": endpoint.tls_cert, "keyfile": endpoint.tls_key}
    if endpoint.tls_client_ca:
        try:
            check.load_verify_locations(endpoint.tls_client_ca)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                env_name(f"{prefix}_tls_client_ca"),
                f"{endpoint.tls_client_ca} holds no CA certificate in PEM: {exc}",
            ) from None
        arguments |= {"client_cafile": endpoint.tls_client_ca, "client_auth_required": True}
    return arguments


def _bind_error(endpoint: EndpointConfig, exc: OSError) -> ConfigError:
    """Why the endpoint cannot listen, naming the setting to change."""
    where = f"{endpoint.host}:{endpoint.port}"
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            env_name(f"{endpoint.prefix}_port"), f"cannot listen on {where}: {reason}"
        )
    return ConfigError(
        env_name(f"{endpoint.prefix}_host"),
        f"cannot listen on {where}: {reason} (an address of this host: 127.0.0.1, ::1, "
        "0.0.0.0 for every interface, or one interface's)",
    )


def _harden(server: Any, endpoint: EndpointConfig) -> None:
    """prometheus_client completes the TLS handshake in its one accepting thread: a
    client that connects and sends nothing would hold every scrape up. The handshake
    is moved to the connection's own thread (its first read), and every connection
    gets a timeout. A refused client (no certificate, plain http on the https port)
    is a debug line, not a traceback on stderr."""
    if isinstance(server.socket, ssl.SSLSocket):
        # read by SSLSocket.accept for the sockets it accepts (not in the type stubs)
        setattr(server.socket, "do_handshake_on_connect", False)  # noqa: B010
    handler = server.RequestHandlerClass
    server.RequestHandlerClass = cast(
        Any, type("TimedHandler", (handler,), {"timeout": CONNECTION_TIMEOUT_S})
    )

    def handle_error(request: Any, client_address: Any) -> None:
        log.debug(
            "%s endpoint: a connection from %s failed: %s",
            endpoint.prefix,
            client_address,
            sys.exc_info()[1],
        )

    server.handle_error = handle_error

"""Both Prometheus endpoints (the exporter, the driver's) listen on their host only, and
speak https, or mutual TLS, through prometheus_client's own TLS, with the test CA."""

from __future__ import annotations

import dataclasses
import http.client
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from devkit.ports import free_port
from scripts.tlskit import Kit, make_kit
from tests.integration.cli_helpers import SCRIPT
from tests.support import REPO, two_phase
from twophase.config import ExporterConfig, StagingConfig, TargetConfig, load_exporter_config
from twophase.errors import ConfigError
from twophase.operations import start_exporter
from twophase.operations.exporter import Exporter

UNREACHABLE = (urllib.error.URLError, http.client.HTTPException, OSError)


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    return make_kit(tmp_path_factory.mktemp("pki"))


def tls(kit: Kit, mutual: bool = False) -> ExporterConfig:
    """An exporter serving https with the kit's server certificate (for ``localhost``)."""
    client_ca = str(kit.ca) if mutual else None
    return ExporterConfig(
        tls_cert=str(kit.server_cert), tls_key=str(kit.server_key), tls_client_ca=client_ca
    )


def client(kit: Kit, certificate: bool = False) -> ssl.SSLContext:
    """Prometheus's side: trusts the test CA; with ``certificate``, shows its own."""
    context = ssl.create_default_context(cafile=str(kit.ca))
    if certificate:
        context.load_cert_chain(str(kit.client_cert), str(kit.client_key))
    return context


def get(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return str(answer.read().decode())


@pytest.fixture
def https(staging: StagingConfig, kit: Kit) -> Iterator[Exporter]:
    running = start_exporter(staging, port=0, exporter=tls(kit))
    yield running
    running.close()


def test_the_exporter_serves_https_only(https: Exporter, kit: Kit) -> None:
    assert https.url == f"https://127.0.0.1:{https.port}/metrics"
    page = get(f"https://localhost:{https.port}/metrics", client(kit))
    assert "twophase_store_up 1.0" in page
    with pytest.raises(UNREACHABLE):
        get(f"http://127.0.0.1:{https.port}/metrics")  # plain http: no answer
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(f"https://localhost:{https.port}/metrics", ssl.create_default_context())


def test_an_idle_connection_holds_up_no_scrape(https: Exporter, kit: Kit) -> None:
    """prometheus_client would do the TLS handshake in its one accepting thread: a client
    that connects and says nothing would stall every scrape behind it."""
    with socket.create_connection(("127.0.0.1", https.port)):
        started = time.monotonic()
        assert "twophase_store_up" in get(f"https://localhost:{https.port}/metrics", client(kit))
        assert time.monotonic() - started < 2


def test_mutual_tls_refuses_a_scraper_without_a_client_certificate(
    staging: StagingConfig, kit: Kit
) -> None:
    running = start_exporter(staging, port=0, exporter=tls(kit, mutual=True))
    try:
        url = f"https://localhost:{running.port}/metrics"
        assert "twophase_store_up 1.0" in get(url, client(kit, certificate=True))
        with pytest.raises(UNREACHABLE):
            get(url, client(kit))
    finally:
        running.close()


def test_an_endpoint_listens_on_its_host_only(staging: StagingConfig) -> None:
    assert ExporterConfig().host == "127.0.0.1"  # this host only, unless told
    loopback = start_exporter(staging, port=0)
    other = start_exporter(staging, port=0, host="127.0.0.2")
    try:
        assert loopback.served.server.server_address[0] == "127.0.0.1"
        assert "twophase_store_up" in get(f"http://127.0.0.1:{loopback.port}/metrics")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", loopback.port), timeout=5).close()
        assert "twophase_store_up" in get(f"http://127.0.0.2:{other.port}/metrics")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", other.port), timeout=5).close()
    finally:
        loopback.close()
        other.close()


def test_an_endpoint_that_cannot_work_is_a_config_error_naming_its_setting(
    staging: StagingConfig, kit: Kit
) -> None:
    port = free_port()
    wrong_key = dataclasses.replace(tls(kit), tls_key=str(kit.client_key))
    with pytest.raises(ConfigError, match=r"TWOPHASE_EXPORTER_TLS_CERT: .*not a certificate"):
        start_exporter(staging, port=port, exporter=wrong_key)
    with pytest.raises(ConfigError, match=r"TWOPHASE_EXPORTER_HOST: cannot listen on 192\.0\.2\.1"):
        start_exporter(staging, port=port, host="192.0.2.1")  # not an address of this host
    running = start_exporter(staging, port=port)  # nothing above kept the port
    try:
        with pytest.raises(ConfigError, match="TWOPHASE_EXPORTER_PORT: cannot listen"):
            start_exporter(staging, port=port)
    finally:
        running.close()
    with pytest.raises(ConfigError, match="TWOPHASE_EXPORTER_TLS_CLIENT_CA: needs"):
        load_exporter_config(env={}, exporter_tls_client_ca=str(kit.ca))


def test_the_driver_serves_its_metrics_over_mutual_tls(
    staging: StagingConfig, influx: TargetConfig, kit: Kit
) -> None:
    port = free_port()
    metered = dataclasses.replace(
        influx,
        metrics_port=port,
        metrics_tls_cert=str(kit.server_cert),
        metrics_tls_key=str(kit.server_key),
        metrics_tls_client_ca=str(kit.ca),
    )
    with two_phase(staging, metered, serve_metrics=True):
        url = f"https://localhost:{port}/metrics"
        assert "twophase_target_request_duration_seconds" in get(url, client(kit, True))
        with pytest.raises(UNREACHABLE):
            get(url, client(kit))
        with pytest.raises(UNREACHABLE):
            get(f"http://127.0.0.1:{port}/metrics")


def test_twophase_metrics_serve_takes_its_tls_from_the_environment(
    staging_url: str, kit: Kit
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWOPHASE_")}
    env |= {
        "TWOPHASE_STAGING_URL": staging_url,
        "TWOPHASE_EXPORTER_TLS_CERT": str(kit.server_cert),
        "TWOPHASE_EXPORTER_TLS_KEY": str(kit.server_key),
    }
    served = subprocess.Popen(
        [str(SCRIPT), "metrics", "serve", "--port", "0"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert served.stderr is not None
        line = served.stderr.readline()  # twophase: serving metrics on https://...
        assert "serving metrics on https://127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert "twophase_store_up 1.0" in get(f"https://localhost:{port}/metrics", client(kit))
    finally:
        served.send_signal(signal.SIGTERM)
        served.wait(timeout=30)

#!/usr/bin/env python3
"""A test CA and certificates (the ``openssl`` command), and private PostgreSQL and
InfluxDB servers that speak only TLS with them, for the TLS tests.

Stdlib and ``openssl`` only, like :mod:`devkit`, whose servers these extend.
Everything is made fresh in a folder: a CA, a server certificate for ``localhost``
and ``REMOTE_NAME`` (and for those names only: connecting by ``127.0.0.1`` is a host
name mismatch), a client certificate for the PostgreSQL role ``twophase``, and an
unrelated "wrong" CA.

    python scripts/tlskit.py FOLDER      # make the files, print their paths
"""

from __future__ import annotations

import shlex
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `scripts` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit import PG_SUPERUSER, PG_USER, InfluxServer, PostgresServer, ServiceError

DAYS = "30"
# A name that is not loopback, as a server across a network has: tests reach the local
# server by it through libpq's hostaddr (the certificate is checked against the name).
# .test never resolves (RFC 6761).
REMOTE_NAME = "staging.twophase.test"
_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Kit:
    """The files of one test PKI (PEM)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ServiceError(f"openssl {shlex.join(args)} failed:\n{done.stderr}")


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req",
        "-x509",
        *_CURVE,
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        DAYS,
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )
    return cert, key


def _signed(folder: Path, name: str, cn: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    cert, key, csr = folder / f"{name}.crt", folder / f"{name}.key", folder / f"{name}.csr"
    extfile = folder / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl(
        "req", *_CURVE, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}", cwd=folder
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        DAYS,
        "-extfile",
        str(extfile),
        cwd=folder,
    )
    key.chmod(0o600)  # libpq refuses a client key others can read
    return cert, key


def make_kit(folder: Path) -> Kit:
    """A fresh CA, server and client certificates, and a wrong CA, under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca(folder, "twophase-test-ca")
    names = f"subjectAltName=DNS:localhost,DNS:{REMOTE_NAME}"
    server = _signed(folder, "server", "localhost", ca, names)
    client = _signed(folder, "client", PG_USER, ca, "extendedKeyUsage=clientAuth")
    wrong, _ = _ca(folder, "wrong-ca")
    return Kit(ca[0], server[0], server[1], client[0], client[1], wrong)


class TlsPostgres(PostgresServer):
    """A private cluster that accepts TCP connections over TLS only, each with a client
    certificate signed by the kit's CA whose name is the role's (``clientcert=verify-full``)."""

    def __init__(self, root: Path, port: int, kit: Kit) -> None:
        super().__init__(root, port)
        self.kit = kit

    def _server_files(self) -> tuple[Path, Path, Path]:
        """The server's copies of its certificate, key and CA, owned by the server user
        (PostgreSQL refuses a key others can read)."""
        names = ("server.crt", "server.key", "ca.crt")
        sources = (self.kit.server_cert, self.kit.server_key, self.kit.ca)
        copies = tuple(self.base / name for name in names)
        for source, copy in zip(sources, copies, strict=True):
            if not copy.exists():
                shutil.copyfile(source, copy)
                if self._as_root:
                    shutil.chown(copy, PG_SUPERUSER, PG_SUPERUSER)
                copy.chmod(0o600)
        return copies  # type: ignore[return-value]

    def _server_options(self) -> str:
        cert, key, ca = self._server_files()
        tls = ["-c", "ssl=on", "-c", f"ssl_cert_file={cert}", "-c", f"ssl_key_file={key}"]
        tls += ["-c", f"ssl_ca_file={ca}"]
        return f"{super()._server_options()} {shlex.join(tls)}"

    def _initdb(self) -> None:
        super()._initdb()
        (self.data_dir / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
        )

    def tls_url_for(self, database: str, host: str = "localhost") -> str:
        """The twophase role's URL over TLS, by ``host`` (the certificate names localhost)."""
        return self.url_for(database).replace(f"127.0.0.1:{self.port}", f"{host}:{self.port}")


class HttpsInflux(InfluxServer):
    """InfluxDB 1.x serving its HTTP API over TLS only, with the kit's server certificate."""

    def __init__(self, root: Path, port: int, kit: Kit) -> None:
        super().__init__(root, port)
        self.kit = kit
        context = ssl.create_default_context(cafile=str(kit.ca))
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    def _config(self) -> str:
        bind = f'  bind-address = "127.0.0.1:{self.port}"\n'
        https = (
            f"{bind}  https-enabled = true\n"
            f'  https-certificate = "{self.kit.server_cert}"\n'
            f'  https-private-key = "{self.kit.server_key}"\n'
        )
        return super()._config().replace(bind, https)

    def _status(self, path: str, data: bytes | None = None) -> int | None:
        request = urllib.request.Request(self.url + path, data=data)
        try:
            with self._opener.open(request, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):
            return None

    def is_reachable(self) -> bool:
        return self._status(self.health_path) == self.healthy_status

    def query(self, statement: str) -> int | None:
        return self._status("/query", urllib.parse.urlencode({"q": statement}).encode())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    kit = make_kit(Path(argv[0]))
    for name, path in vars(kit).items():
        print(f"{name}={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

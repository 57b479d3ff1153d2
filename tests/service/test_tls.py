"""TLS between services, with a throwaway CA the test makes (the `cryptography` package).

A coordinator (in this process, real Postgres) serving TLS from its settings answers a
client that trusts the CA, over a channel made the way every service makes one
(`open_channel` with the TLS its `*_UPSTREAM_TLS_*` settings name); a plaintext client is
refused. With client certificates required (`*_TLS_CLIENT_CA_FILE`), a client without
one is refused, and so is one whose certificate another CA signed. Half-configured or
missing files stop a service at start with a message naming the variable.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.coordinator.app import build
from services.coordinator.identity.accounts import insert_key
from services.coordinator.identity.auth import Grant, ScopeName
from services.coordinator.platform.clock import FrozenClock
from services.coordinator.platform.db import Database
from services.coordinator.settings import CoordinatorSettings
from services.preview.settings import PREFIX as PREVIEW
from services.preview.settings import PreviewSettings
from testbed.harness.coordinator import EPOCH
from workshop.kit.auth import bearer_metadata
from workshop.kit.channels import open_channel
from workshop.kit.server import Server
from workshop.kit.settings import SettingsError, load_settings
from workshop.kit.tls import ClientTls, client_tls, client_tls_from_environ
from workshop.v1 import identity_pb2, identity_pb2_grpc

pytestmark = pytest.mark.timeout(60)

REFUSED_WITHIN_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Pem:
    certificate: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Authority:
    """A CA that signs server and client certificates, written as PEM files under `root`."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name = root, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        now = datetime.now(UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.file = root / f"{name}-ca.pem"
        self.file.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server: bool) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        pem = Pem(
            self.root / f"{self.name}-{common_name}.pem",
            self.root / f"{self.name}-{common_name}.key",
        )
        pem.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        pem.key.write_bytes(_key_pem(key))
        return pem


@dataclasses.dataclass
class Pki:
    ca: Authority
    server: Pem
    client: Pem
    stranger: Pem  # a client certificate of another CA


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = Authority(tmp_path, "workshop"), Authority(tmp_path, "other")
    return Pki(
        ca,
        ca.issue("coordinator", server=True),
        ca.issue("preview", server=False),
        other.issue("preview", server=False),
    )


@asynccontextmanager
async def tls_coordinator(
    dsn: str, settings: CoordinatorSettings
) -> AsyncIterator[tuple[int, str]]:
    """A coordinator serving with `settings`' TLS; (its port, an admin key's secret)."""
    clock = FrozenClock(EPOCH)
    async with Database.open(dsn, size=2) as db:
        async with db.transaction() as connection:
            _, secret = await insert_key(
                connection, "admin", (Grant(ScopeName.ADMIN),), "", None, clock.now()
            )
        coordinator = build(db, clock, job_capacity=settings.job_capacity)
        server = Server(
            label="coordinator-tls-test",
            settings=settings,
            services=coordinator.services,
            workers=coordinator.workers,
        )
        port = await server.start()
        try:
            yield port, secret
        finally:
            await server.stop()


def coordinator_settings(dsn: str, pki: Pki, *, client_ca: bool = False) -> CoordinatorSettings:
    """Loaded from variables as the process loads them, so their checks run."""
    environ = {
        "COORDINATOR_DATABASE_URL": dsn,
        "COORDINATOR_PORT": "0",
        "COORDINATOR_DRAIN_SECONDS": "0",
        "COORDINATOR_GRACE_SECONDS": "1",
        "COORDINATOR_TLS_CERT_FILE": str(pki.server.certificate),
        "COORDINATOR_TLS_KEY_FILE": str(pki.server.key),
    }
    if client_ca:
        environ["COORDINATOR_TLS_CLIENT_CA_FILE"] = str(pki.ca.file)
    return load_settings(CoordinatorSettings, "COORDINATOR", environ)


def preview_settings(pki: Pki, client: Pem | None = None) -> PreviewSettings:
    """A preview service's settings naming the CA (and a client certificate)."""
    environ = {
        "PREVIEW_S3_ENDPOINT": "127.0.0.1:9000",
        "PREVIEW_S3_ACCESS_KEY": "a",
        "PREVIEW_S3_SECRET_KEY": "b",
        "PREVIEW_SERVICE_KEY": "wk_x.y",
        "PREVIEW_UPSTREAM_TLS_CA_FILE": str(pki.ca.file),
    }
    if client is not None:
        environ["PREVIEW_UPSTREAM_TLS_CERT_FILE"] = str(client.certificate)
        environ["PREVIEW_UPSTREAM_TLS_KEY_FILE"] = str(client.key)
    return load_settings(PreviewSettings, PREVIEW, environ)


async def who_am_i(port: int, secret: str, tls: ClientTls | None) -> grpc.StatusCode:
    async with open_channel(
        f"127.0.0.1:{port}", max_attempts=1, deadline_seconds=REFUSED_WITHIN_SECONDS, tls=tls
    ) as channel:
        stub = identity_pb2_grpc.IdentityServiceStub(channel)
        try:
            await stub.WhoAmI(identity_pb2.WhoAmIRequest(), metadata=bearer_metadata(secret))
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK


async def test_a_tls_coordinator_answers_tls_clients_and_refuses_plaintext(
    pg_dsn: str, pki: Pki
) -> None:
    async with tls_coordinator(pg_dsn, coordinator_settings(pg_dsn, pki)) as (port, secret):
        assert await who_am_i(port, secret, client_tls(preview_settings(pki))) is grpc.StatusCode.OK
        # the command lines' channels, from WORKSHOP_TLS_CA_FILE
        cli = client_tls_from_environ({"WORKSHOP_TLS_CA_FILE": str(pki.ca.file)})
        assert await who_am_i(port, secret, cli) is grpc.StatusCode.OK
        assert client_tls_from_environ({}) is None
        assert await who_am_i(port, secret, None) is grpc.StatusCode.UNAVAILABLE
        # trusting another CA: the server's certificate does not verify
        other = ClientTls(pki.stranger.certificate.read_bytes())
        assert await who_am_i(port, secret, other) is grpc.StatusCode.UNAVAILABLE


async def test_required_client_certificates_refuse_none_and_another_cas(
    pg_dsn: str, pki: Pki
) -> None:
    settings = coordinator_settings(pg_dsn, pki, client_ca=True)
    async with tls_coordinator(pg_dsn, settings) as (port, secret):
        signed = client_tls(preview_settings(pki, pki.client))
        assert await who_am_i(port, secret, signed) is grpc.StatusCode.OK
        without = client_tls(preview_settings(pki))
        assert await who_am_i(port, secret, without) is grpc.StatusCode.UNAVAILABLE
        stranger = client_tls(preview_settings(pki, pki.stranger))
        assert await who_am_i(port, secret, stranger) is grpc.StatusCode.UNAVAILABLE
        assert await who_am_i(port, secret, None) is grpc.StatusCode.UNAVAILABLE


def problems(environ: dict[str, str]) -> dict[str, str]:
    base = {"COORDINATOR_DATABASE_URL": "postgresql://x@y/z"}
    with pytest.raises(SettingsError) as caught:
        load_settings(CoordinatorSettings, "COORDINATOR", {**base, **environ})
    return dict(caught.value.problems)


def test_half_configured_or_missing_files_fail_at_start(pki: Pki, tmp_path: Path) -> None:
    cert, key = str(pki.server.certificate), str(pki.server.key)
    assert problems({"COORDINATOR_TLS_CERT_FILE": cert}) == {
        "COORDINATOR_TLS_KEY_FILE": "required with TLS_CERT_FILE (the certificate's key)"
    }
    assert problems({"COORDINATOR_TLS_KEY_FILE": key}) == {
        "COORDINATOR_TLS_CERT_FILE": "required with TLS_KEY_FILE (the key's certificate)"
    }
    assert problems({"COORDINATOR_TLS_CLIENT_CA_FILE": str(pki.ca.file)}) == {
        "COORDINATOR_TLS_CERT_FILE": "required with TLS_CLIENT_CA_FILE (client certificates "
        "need TLS)"
    }
    missing = str(tmp_path / "nope.pem")
    assert problems({"COORDINATOR_TLS_CERT_FILE": missing, "COORDINATOR_TLS_KEY_FILE": key}) == {
        "COORDINATOR_TLS_CERT_FILE": f"no such file {missing!r}"
    }
    # a key where the certificate belongs, and the other way round
    assert problems({"COORDINATOR_TLS_CERT_FILE": key, "COORDINATOR_TLS_KEY_FILE": cert}) == {
        "COORDINATOR_TLS_CERT_FILE": f"{key!r} holds no PEM certificate",
        "COORDINATOR_TLS_KEY_FILE": f"{cert!r} holds no PEM private key",
    }
    base = {
        "PREVIEW_S3_ENDPOINT": "127.0.0.1:9000",
        "PREVIEW_S3_ACCESS_KEY": "a",
        "PREVIEW_S3_SECRET_KEY": "b",
        "PREVIEW_SERVICE_KEY": "wk_x.y",
        "PREVIEW_UPSTREAM_TLS_CERT_FILE": str(pki.client.certificate),
    }
    with pytest.raises(SettingsError) as caught:
        load_settings(PreviewSettings, PREVIEW, base)
    assert dict(caught.value.problems) == {
        "PREVIEW_UPSTREAM_TLS_KEY_FILE": "required with UPSTREAM_TLS_CERT_FILE (the "
        "certificate's key)",
        "PREVIEW_UPSTREAM_TLS_CA_FILE": "required with UPSTREAM_TLS_CERT_FILE (a client "
        "certificate is sent over TLS)",
    }


def test_tls_is_off_by_default() -> None:
    settings = load_settings(
        CoordinatorSettings, "COORDINATOR", {"COORDINATOR_DATABASE_URL": "postgresql://x@y/z"}
    )
    assert (settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file) == (
        None,
        None,
        None,
    )

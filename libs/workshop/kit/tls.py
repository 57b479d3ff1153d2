"""TLS between services: a gRPC server's certificate, a client's trust, and their checks.

Off by default: plaintext on loopback stays what tests and the demo use. A server serves
TLS when its settings name a certificate and its key (`<PREFIX>_TLS_CERT_FILE`,
`<PREFIX>_TLS_KEY_FILE`); with `<PREFIX>_TLS_CLIENT_CA_FILE` as well it requires every
client to present a certificate signed by that CA. A service that calls others (the
preview service, the gateway, the processor; the `workshop` command line) uses TLS to them
when `<PREFIX>_UPSTREAM_TLS_CA_FILE` names the CA that signed their certificates, and
presents `<PREFIX>_UPSTREAM_TLS_CERT_FILE` and `..._KEY_FILE` to servers that require
client certificates. The files are PEM; they are read once, at start (docs/operations.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import grpc

from workshop.kit.settings import Check, setting

_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"


def _pem(marker: bytes, what: str) -> Check:
    def check(path: Path) -> str | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return f"no such file {str(path)!r}"
        except OSError as error:
            return f"cannot read {str(path)!r}: {error.strerror or error}"
        return None if marker in data else f"{str(path)!r} holds no PEM {what}"

    return check


certificate_file = _pem(_CERTIFICATE, "certificate")
private_key_file = _pem(_PRIVATE_KEY, "private key")


def _pair(
    cert: Path | None, key: Path | None, cert_field: str, key_field: str
) -> list[tuple[str, str]]:
    """A certificate and its key go together: the missing half, named."""
    if cert is not None and key is None:
        return [(key_field, f"required with {cert_field.upper()} (the certificate's key)")]
    if key is not None and cert is None:
        return [(cert_field, f"required with {key_field.upper()} (the key's certificate)")]
    return []


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerTlsSettings:
    """The TLS fields every gRPC server has (ServerSettings holds them)."""

    tls_cert_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None,
        help="PEM certificate (chain) the gRPC server presents; set with TLS_KEY_FILE to "
        "serve TLS only (empty: plaintext).",
        check=certificate_file,
    )
    tls_key_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None, help="PEM private key of TLS_CERT_FILE.", check=private_key_file
    )
    tls_client_ca_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None,
        help="PEM CA certificate(s); set = every client must present a certificate signed "
        "by one of them (needs TLS_CERT_FILE).",
        check=certificate_file,
    )

    def cross_checks(self) -> list[tuple[str, str]]:
        problems = _pair(self.tls_cert_file, self.tls_key_file, "tls_cert_file", "tls_key_file")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            problems.append(
                ("tls_cert_file", "required with TLS_CLIENT_CA_FILE (client certificates need TLS)")
            )
        return problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientTlsSettings:
    """The TLS fields of a service's channels to the servers it calls."""

    upstream_tls_ca_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None,
        help="PEM CA certificate(s) that signed the gRPC servers this service calls; set = "
        "TLS to them (empty: plaintext).",
        check=certificate_file,
    )
    upstream_tls_cert_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None,
        help="PEM client certificate presented to servers that require one (needs "
        "UPSTREAM_TLS_CA_FILE and UPSTREAM_TLS_KEY_FILE).",
        check=certificate_file,
    )
    upstream_tls_key_file: Path | None = setting(  # noqa: RUF009 - Path is immutable
        None, help="PEM private key of UPSTREAM_TLS_CERT_FILE.", check=private_key_file
    )

    def cross_checks(self) -> list[tuple[str, str]]:
        problems = _pair(
            self.upstream_tls_cert_file,
            self.upstream_tls_key_file,
            "upstream_tls_cert_file",
            "upstream_tls_key_file",
        )
        if self.upstream_tls_cert_file is not None and self.upstream_tls_ca_file is None:
            problems.append(
                (
                    "upstream_tls_ca_file",
                    "required with UPSTREAM_TLS_CERT_FILE (a client certificate is sent over TLS)",
                )
            )
        return problems


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How a client channel checks its server, and the certificate it shows (PEM bytes)."""

    ca: bytes
    certificate: bytes | None = None
    key: bytes | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.certificate
        )

    @classmethod
    def from_files(
        cls, ca: Path | None, certificate: Path | None = None, key: Path | None = None
    ) -> ClientTls | None:
        """None (plaintext) without a CA file."""
        if ca is None:
            return None
        return cls(
            ca.read_bytes(),
            certificate.read_bytes() if certificate else None,
            key.read_bytes() if key else None,
        )


def client_tls(settings: ClientTlsSettings) -> ClientTls | None:
    """A service's channel TLS from its settings (None: plaintext)."""
    return ClientTls.from_files(
        settings.upstream_tls_ca_file,
        settings.upstream_tls_cert_file,
        settings.upstream_tls_key_file,
    )


# The `workshop` command line's variables: the same three, for its channels.
CLI_TLS_VARIABLES = ("WORKSHOP_TLS_CA_FILE", "WORKSHOP_TLS_CERT_FILE", "WORKSHOP_TLS_KEY_FILE")


def client_tls_from_environ(environ: Mapping[str, str]) -> ClientTls | None:
    """The command line's channel TLS from CLI_TLS_VARIABLES (unset or empty: plaintext)."""
    ca, certificate, key = (
        Path(environ[name]) if environ.get(name) else None for name in CLI_TLS_VARIABLES
    )
    return ClientTls.from_files(ca, certificate, key)


def server_credentials(settings: ServerTlsSettings) -> grpc.ServerCredentials | None:
    """The server's TLS credentials (None: plaintext); client certificates are required
    exactly when a client CA is set."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    client_ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=client_ca.read_bytes() if client_ca else None,
        require_client_auth=client_ca is not None,
    )

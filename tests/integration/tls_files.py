"""Certificates for TLS tests on loopback, made at test time: a CA, a server certificate for
127.0.0.1 and localhost, a client certificate, and a second CA that trusts neither (the
"wrong" bundle a library variable may point at). With the ``cryptography`` package when it is
installed, else the ``openssl`` command; without either the tests that need them are
unavailable (tests/support.py). Not a test module."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support import program_or_unavailable

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    """Paths of PEM files (all strings)."""

    ca: str
    server_certificate: str
    server_key: str
    client_certificate: str
    client_key: str
    other_ca: str


def make_tls_files(directory: Path) -> TlsFiles:
    """Writes the files into ``directory`` and returns their paths."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        program_or_unavailable(
            "openssl", install="apt-get install -y openssl, or pip install cryptography"
        )
        return _with_openssl(directory)
    return _with_cryptography(directory)


def _with_openssl(directory: Path) -> TlsFiles:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for name in ("ca", "other_ca"):
        run(
            "req", "-x509", *curve, "-keyout", f"{name}.key", "-out", f"{name}.pem",
            "-days", "2", "-subj", f"/CN=otel-training test {name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        extensions = directory / f"{name}.ext"
        extensions.write_text(
            f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"
        )
        run("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", extensions.name,
        )  # fmt: skip
    return _files(directory)


def _with_cryptography(directory: Path) -> TlsFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def write(name: str, certificate, key) -> None:
        (directory / f"{name}.pem").write_bytes(
            certificate.public_bytes(serialization.Encoding.PEM)
        )
        (directory / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def build(subject: str, issuer, issuer_key, key, extensions):
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key or key, hashes.SHA256())

    cas = {}
    for name in ("ca", "other_ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = build(
            f"otel-training test {name}", None, None, key,
            [(x509.BasicConstraints(ca=True, path_length=None), True)],
        )  # fmt: skip
        write(name, certificate, key)
        cas[name] = (certificate, key)
    ca_certificate, ca_key = cas["ca"]
    names = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    )
    for name, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = build(
            name, ca_certificate.subject, ca_key, key,
            [(names, False), (x509.ExtendedKeyUsage([usage]), False)],
        )  # fmt: skip
        write(name, certificate, key)
    return _files(directory)


def _files(directory: Path) -> TlsFiles:
    return TlsFiles(
        ca=str(directory / "ca.pem"),
        server_certificate=str(directory / "server.pem"),
        server_key=str(directory / "server.key"),
        client_certificate=str(directory / "client.pem"),
        client_key=str(directory / "client.key"),
        other_ca=str(directory / "other_ca.pem"),
    )

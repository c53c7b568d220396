"""Throwaway certificate authorities and certificates for the TLS tests (``cryptography``).

Every certificate serves both ends of mutual TLS (server and client auth), like the one the
chart's cert-manager ``Certificate`` issues, and names ``localhost`` and ``127.0.0.1``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Authority:
    """A CA: its key and self-signed certificate."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @classmethod
    def create(cls, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate)

    def issue(self, name: str, dns_names: tuple[str, ...] = LOOPBACK_NAMES) -> tuple[bytes, bytes]:
        """A certificate (PEM) for server and client auth naming ``dns_names`` (IP addresses
        become IP SANs), and its key (PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alternative: list[x509.GeneralName] = []
        for entry in dns_names:
            try:
                alternative.append(x509.IPAddress(ipaddress.ip_address(entry)))
            except ValueError:
                alternative.append(x509.DNSName(entry))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return certificate.public_bytes(serialization.Encoding.PEM), key_pem

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


def write_files(
    folder: Path,
    authority: Authority,
    name: str = "pathways",
    dns_names: tuple[str, ...] = LOOPBACK_NAMES,
    trusted: Authority | None = None,
) -> dict[str, str]:
    """Write ``tls.crt``, ``tls.key`` and ``ca.crt`` (the keys of a kubernetes.io/tls Secret)
    into ``folder``: a certificate issued by ``authority`` and the CA ``trusted`` (default: the
    same). Returns the ``PATHWAYS_TLS_*`` variables naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    certificate, key = authority.issue(name, dns_names)
    (folder / "tls.crt").write_bytes(certificate)
    (folder / "tls.key").write_bytes(key)
    (folder / "ca.crt").write_bytes((trusted or authority).pem)
    return {
        "PATHWAYS_TLS_CERT": str(folder / "tls.crt"),
        "PATHWAYS_TLS_KEY": str(folder / "tls.key"),
        "PATHWAYS_TLS_CA": str(folder / "ca.crt"),
    }

"""TLS for the collectors: a small certificate authority and a server certificate it issues.

``esa keys tls --output DIR [--hosts 127.0.0.1,localhost]`` writes

* ``DIR/ca.crt``: the authority devices trust (``esa simulate --collector-ca``);
* ``DIR/ca.key`` (0600): its key, kept by whoever enrols collectors;
* ``DIR/collector.crt`` and ``DIR/collector.key`` (0600): the server certificate (ECDSA P-256,
  subjectAltName the given hosts and IP addresses, extended key usage serverAuth) and its key,
  for ``esa collect --tls-cert/--tls-key``.

X.509 from ``cryptography``; the server and clients use the standard library's ``ssl`` with
its defaults (certificate and host name verified, TLS 1.2 or later).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from schemas.crypto.key_files import PRIVATE_MODE, KeyError_

__all__ = ["CA_CERT", "CA_KEY", "SERVER_CERT", "SERVER_KEY", "make_collector_tls"]

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "collector.crt", "collector.key"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    os.chmod(path, PRIVATE_MODE)


def make_collector_tls(
    directory: str | os.PathLike[str], hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365
) -> dict[str, Path]:
    """Write a fresh authority and a server certificate for ``hosts``; returns the four paths.
    Existing files are refused (KeyError_)."""
    if not hosts or any(not host or len(host) > 253 for host in hosts):
        raise KeyError_("--hosts must name one or more host names or IP addresses")
    if not 1 <= days <= 36_500:
        raise KeyError_(f"--days must be in [1, 36500], got {days}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)}
    for path in paths.values():
        if path.exists():
            raise KeyError_(f"{path} exists; choose another --output")
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("esa collector enrolment CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(paths[CA_KEY], ca_key)
    _write_private(paths[SERVER_KEY], server_key)
    paths[CA_CERT].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[SERVER_CERT].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return paths

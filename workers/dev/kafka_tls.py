"""TLS and SASL/SCRAM for the test Kafka's client listeners: certificates made at start."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.dev.kafka_jars import KafkaSetupError


@dataclass(frozen=True)
class Security:
    """TLS and SASL/SCRAM-SHA-256 on the client listeners: a CA and a node certificate made
    for 127.0.0.1 at start, and SCRAM ``users`` (name -> password) stored in the cluster's
    metadata at format time."""

    users: Mapping[str, str]
    mechanism: str = "SCRAM-SHA-256"

    @property
    def protocol(self) -> str:
        return "SASL_SSL"


def tls_files(folder: Path) -> tuple[Path, Path]:
    """A CA (``ca.pem``) and a certificate for 127.0.0.1/localhost signed by it, with its
    PKCS#8 key (``node.pem``: key then certificate, as Kafka's PEM key store wants)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        folder / n for n in ("ca.key", "ca.pem", "node.key", "node.csr", "node.crt")
    )
    ext = folder / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*args: str) -> None:
        try:
            subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise KafkaSetupError(f"openssl failed making test certificates in {folder}: {exc}") from None

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
            "-days", "30", "-subj", "/CN=reval-test-ca")  # fmt: skip
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "30", "-extfile", str(ext))  # fmt: skip
    pkcs8 = folder / "node.pk8"
    openssl("pkcs8", "-topk8", "-nocrypt", "-in", str(key), "-out", str(pkcs8))
    bundle = folder / "node.pem"
    bundle.write_text(pkcs8.read_text() + cert.read_text())
    return ca, bundle

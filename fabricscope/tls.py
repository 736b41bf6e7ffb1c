"""Transport security shared by agent and collector: TLS files, bearer tokens, a test PKI.

    server_credentials(cert, key, client_ca)   # collector; client_ca set: mutual TLS
    channel_credentials(ca, cert, key)          # agent; cert+key set: client certificate
    read_secret(path, what)                     # a token file, stripped
    bearer(token)                               # the gRPC metadata tuple

Secrets (tokens, private keys) never enter a log line or an exception message:
errors name the file and the problem, never its content.

`make_pki(directory, clients)` creates a throwaway CA, a server certificate for
127.0.0.1/localhost and one client certificate per name, with the openssl CLI
(real X.509, RSA 2048, SHA-256). It exists for tests, benches and the demo;
production certificates come from the cluster's PKI (cert-manager or similar).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from fabricscope.errors import UserError

#: gRPC metadata key carrying the bearer token (lower case, as HTTP/2 requires).
AUTH_HEADER = "authorization"


def read_file(path: str, what: str, fix: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}", fix) from None
    if not data.strip():
        raise UserError(f"{what} {path} is empty", fix)
    return data


def read_secret(path: str, what: str = "token file") -> str:
    """The file's content without surrounding whitespace (a trailing newline is usual)."""
    text = read_file(path, what, "point the token_file setting at a readable file holding "
                     "the token (one line)").decode(
        "utf-8", errors="replace").strip()
    if any(c.isspace() or not c.isprintable() for c in text):
        raise UserError(f"{what} {path} must hold one token without spaces",
                        "write only the token into the file")
    return text


def bearer(token: str) -> tuple[str, str]:
    return (AUTH_HEADER, f"Bearer {token}")


def token_from_metadata(metadata) -> str | None:
    """The bearer token of gRPC invocation metadata; None when absent or malformed."""
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            scheme, _, token = str(value).partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def server_credentials(cert: str, key: str, client_ca: str = ""):
    """grpc.ServerCredentials for TLS; with client_ca, clients must present a certificate
    signed by it (mutual TLS)."""
    import grpc
    fix = "point --tls-cert/--tls-key/--tls-client-ca at PEM files"
    pair = (read_file(key, "TLS key", fix), read_file(cert, "TLS certificate", fix))
    if client_ca:
        return grpc.ssl_server_credentials([pair], read_file(client_ca, "client CA", fix),
                                           require_client_auth=True)
    return grpc.ssl_server_credentials([pair])


def channel_credentials(ca: str = "", cert: str = "", key: str = ""):
    """grpc.ChannelCredentials; ca empty: the system's roots. cert and key go together."""
    import grpc
    fix = "point --tls-ca/--tls-cert/--tls-key at PEM files"
    if bool(cert) != bool(key):
        raise UserError("tls_cert and tls_key must be given together", fix)
    return grpc.ssl_channel_credentials(
        root_certificates=read_file(ca, "TLS CA", fix) if ca else None,
        private_key=read_file(key, "TLS key", fix) if key else None,
        certificate_chain=read_file(cert, "TLS certificate", fix) if cert else None)


@dataclass(frozen=True)
class Pki:
    """File paths of a throwaway PKI made by make_pki."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path

    def client(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-300:]}")


def _issue(directory: Path, name: str, subject: str, ca: str, ca_key: str,
           extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca, "-CAkey", ca_key,
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-sha256",
             "-extfile", f"{name}.ext", cwd=directory)


def make_pki(directory: str | Path, clients: list[str] = (), ca_name: str = "ca") -> Pki:
    """A CA, a server certificate (127.0.0.1, localhost) and client certificates."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca_name}.key",
             "-out", f"{ca_name}.crt", "-days", "2", "-sha256",
             "-subj", f"/CN=fabricscope test {ca_name}", cwd=d)
    _issue(d, "server", "/CN=fabricscope-collector", f"{ca_name}.crt", f"{ca_name}.key",
           "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    for name in clients:
        _issue(d, name, f"/CN={name}", f"{ca_name}.crt", f"{ca_name}.key",
               "extendedKeyUsage=clientAuth\n")
    return Pki(d, d / f"{ca_name}.crt", d / "server.crt", d / "server.key")

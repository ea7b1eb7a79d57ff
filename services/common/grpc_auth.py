"""Authentication for tailspec's gRPC services: the per-run bearer token, TLS material, the bind check.

Every tailspec service requires a per-run secret on every call, loopback included (``require_token``;
``new_token()`` makes one, the pipeline hands it to its actors through Ray and writes it to
``<run_dir>/grpc_token``, mode 0600, for ``tailspec status``). A non-loopback bind without a token or TLS is
refused (``check_bind``). ``GrpcServer`` (``services/common/grpc_server.py``) installs
``TokenAuthInterceptor``: a call without ``authorization: Bearer <token>`` metadata fails with
``UNAUTHENTICATED``; the channels of ``services/common/grpc_client.py`` add that metadata (``auth_metadata``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

DEFAULT_HOST = "127.0.0.1"
TOKEN_ENV = "TAILSPEC_GRPC_TOKEN"  # an operator-chosen run token (else one is generated per run)
TOKEN_FILE = "grpc_token"  # <run_dir>/grpc_token: the run's token, mode 0600, read by `tailspec status`
AUTH_HEADER = "authorization"
REDACTED = "<redacted>"  # what a secret reads as in logs, errors and the saved config


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IPs (``127.0.0.0/8``, ``::1``); hostnames count as non-loopback."""
    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def read_pem(value: bytes | str | os.PathLike | None) -> bytes | None:
    """PEM bytes as given, or read from a path."""
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


@dataclass
class TlsConfig:
    """TLS material (PEM bytes or file paths). ``root_certificates`` + ``require_client_auth`` = mutual TLS."""

    cert_chain: bytes | str | os.PathLike
    private_key: bytes | str | os.PathLike
    root_certificates: bytes | str | os.PathLike | None = None
    require_client_auth: bool = False

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.require_client_auth and self.root_certificates is None:
            raise ValueError("TLS require_client_auth needs root_certificates to verify client certificates")
        return grpc.ssl_server_credentials(
            [(read_pem(self.private_key), read_pem(self.cert_chain))],
            root_certificates=read_pem(self.root_certificates),
            require_client_auth=self.require_client_auth,
        )


def check_bind(host: str, token: str | None, tls: TlsConfig | None) -> None:
    """Raise ``ValueError`` when ``host`` is not loopback and neither a token nor TLS is configured."""
    if not is_loopback(host) and not token and tls is None:
        raise ValueError(
            f"refusing to serve gRPC on non-loopback host {host!r} without authentication: configure a token "
            f"(clients send 'authorization: Bearer <token>' metadata; e.g. ${TOKEN_ENV}) or TLS, "
            f"or bind {DEFAULT_HOST}"
        )


def new_token() -> str:
    """A fresh per-run secret: 256 bits of URL-safe text, never starting with ``-`` (``tailspec status
    --token <token>`` would read that as an option)."""
    return "ts" + secrets.token_urlsafe(32)


def require_token(token: str | None, what: str) -> str:
    """``token`` itself; ``ValueError`` when it is missing (every tailspec service authenticates its callers,
    loopback included)."""
    if not token or not isinstance(token, str):
        raise ValueError(f"{what} needs the run's secret token: every call is authenticated")
    return token


def write_token_file(run_dir: str | os.PathLike, token: str) -> Path:
    """Write ``token`` to ``run_dir/grpc_token`` with mode 0600 (created so, never readable by others for an
    instant); returns the path."""
    path = Path(run_dir) / TOKEN_FILE
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read_token_file(run_dir: str | os.PathLike) -> str:
    """The token in ``run_dir/grpc_token``. Raises ``FileNotFoundError``, or ``PermissionError`` when the file
    is readable by group or others (a leaked secret is refused rather than used)."""
    path = Path(run_dir) / TOKEN_FILE
    st = path.stat()
    if st.st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
    return path.read_text().strip()


def redact(text: str, *tokens: str | None) -> str:
    """``text`` with every occurrence of each non-empty token replaced by ``<redacted>``."""
    for t in tokens:
        if t:
            text = text.replace(t, REDACTED)
    return text


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates against a server configured with ``token``."""
    return ((AUTH_HEADER, f"Bearer {token}"),)


def _authorized(metadata: Iterable[tuple[str, Any]] | None, token: str) -> bool:
    expected = f"Bearer {token}".encode()
    for key, value in metadata or ():
        if key.lower() == AUTH_HEADER:
            got = value.encode() if isinstance(value, str) else bytes(value)
            if hmac.compare_digest(got, expected):
                return True
    return False


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str, exempt_prefixes: Sequence[str] = ()):
        self._token = token
        self._exempt = tuple(exempt_prefixes)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        if method.startswith(self._exempt) or _authorized(
            handler_call_details.invocation_metadata, self._token
        ):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return None
        return _rejecting_handler(handler, method)


def _rejecting_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    async def deny(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: missing or invalid bearer token")

    async def deny_stream(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: missing or invalid bearer token")
        yield  # pragma: no cover - makes this an async generator

    kw = dict(
        request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(deny, **kw)


__all__ = [
    "AUTH_HEADER",
    "DEFAULT_HOST",
    "REDACTED",
    "TOKEN_ENV",
    "TOKEN_FILE",
    "TlsConfig",
    "TokenAuthInterceptor",
    "auth_metadata",
    "check_bind",
    "is_loopback",
    "new_token",
    "read_pem",
    "read_token_file",
    "redact",
    "require_token",
    "write_token_file",
]

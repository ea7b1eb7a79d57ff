"""Clients of tailspec's gRPC services: channels that carry the run's token, health checks, timestamps.

``channel(address, token)`` (sync) and ``aio_channel`` (asyncio) add ``authorization: Bearer <token>`` to
every call (``services/common/grpc_auth.py``); ``tls=True`` dials TLS (client certificates give mutual TLS).
``health_check`` asks the standard ``grpc.health.v1.Health`` service that every ``GrpcServer`` serves.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_auth import auth_metadata, read_pem

DEFAULT_COORDINATOR_PORT = 50051


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call of a sync channel."""

    def __init__(self, token: str):
        self._md = auth_metadata(token)

    def _details(self, d):
        return _CallDetails(
            d.method,
            d.timeout,
            [*(d.metadata or ()), *self._md],
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def _aio_interceptors(token: str) -> list:
    md = auth_metadata(token)

    def details(d):
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()), *md)
        return d._replace(metadata=metadata)

    class UU(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, client_call_details, request):
            return await continuation(details(client_call_details), request)

    class US(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, client_call_details, request):
            return await continuation(details(client_call_details), request)

    class SU(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
            return await continuation(details(client_call_details), request_iterator)

    class SS(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
            return await continuation(details(client_call_details), request_iterator)

    return [UU(), US(), SU(), SS()]


def _channel_credentials(tls_root_certificates, client_cert_chain, client_private_key):
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls_root_certificates),
        private_key=read_pem(client_private_key),
        certificate_chain=read_pem(client_cert_chain),
    )


def channel(
    address: str,
    token: str | None = None,
    *,
    tls: bool = False,
    tls_root_certificates: bytes | str | os.PathLike | None = None,
    client_cert_chain: bytes | str | os.PathLike | None = None,
    client_private_key: bytes | str | os.PathLike | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A synchronous channel to ``address`` (``host:port``); with ``token`` every call carries the bearer
    metadata. ``tls=True`` (implied by ``tls_root_certificates``) dials TLS, with the system roots when no
    roots are given; a client certificate and key give mutual TLS. Use as a context manager or ``.close()``."""
    if tls or tls_root_certificates is not None:
        creds = _channel_credentials(tls_root_certificates, client_cert_chain, client_private_key)
        ch = grpc.secure_channel(address, creds, options=list(options))
    else:
        ch = grpc.insecure_channel(address, options=list(options))
    if token:
        ch = grpc.intercept_channel(ch, _TokenClientInterceptor(token))
    return ch


def aio_channel(
    address: str,
    token: str | None = None,
    *,
    tls: bool = False,
    tls_root_certificates: bytes | str | os.PathLike | None = None,
    client_cert_chain: bytes | str | os.PathLike | None = None,
    client_private_key: bytes | str | os.PathLike | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """``channel`` for asyncio code (create it inside the running event loop that uses it)."""
    interceptors = _aio_interceptors(token) if token else None
    if tls or tls_root_certificates is not None:
        creds = _channel_credentials(tls_root_certificates, client_cert_chain, client_private_key)
        return grpc.aio.secure_channel(address, creds, options=list(options), interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def to_timestamp(t: float | None = None) -> Timestamp:
    """``time.time()`` seconds (now when None) -> ``google.protobuf.Timestamp``."""
    ts = Timestamp()
    ts.FromNanoseconds(int(round((time.time() if t is None else float(t)) * 1e9)))
    return ts


def from_timestamp(msg: Any, name: str) -> float | None:
    """Seconds of the Timestamp field ``name`` of ``msg``; None when unset."""
    if not msg.HasField(name):
        return None
    return getattr(msg, name).ToNanoseconds() / 1e9


def health_check(
    address: str, service: str = "", token: str | None = None, timeout: float = 5.0, **kw
) -> str:
    """The health status name (``SERVING``, ``NOT_SERVING``, ...) of ``service`` at ``address``.
    Raises ``grpc.RpcError`` (e.g. NOT_FOUND for an unknown service, UNAVAILABLE when nothing listens)."""
    with channel(address, token, **kw) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


__all__ = [
    "DEFAULT_COORDINATOR_PORT",
    "aio_channel",
    "channel",
    "from_timestamp",
    "health_check",
    "to_timestamp",
]

"""Telling a service that died from a bug: the errors the control plane and the driver recover from.

A Ray actor that died (``actor_died``) is restarted or its work re-dispatched; a gRPC server that is gone
(``unavailable``) likewise. Any other error propagates: a bug is not a fault.
"""

from __future__ import annotations

import grpc


def actor_died(e: BaseException) -> bool:
    """True when ``e`` says a Ray actor died (its process is gone)."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, RayActorError)


def unavailable(e: BaseException) -> bool:
    """True when ``e`` is a gRPC call to a server that is gone or does not answer in time."""
    return isinstance(e, grpc.RpcError) and e.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )

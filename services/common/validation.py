"""Checks of request fields received over the network (gRPC control plane, ZeroMQ stream headers).

Nothing a peer sends is trusted: every RPC checks its fields before it changes any state, and a bad one is
refused with ``InvalidArgument`` (a ``ValueError`` that ``expose`` answers with ``INVALID_ARGUMENT``), so a
malformed or hostile request never disturbs the run. The helpers return the checked value.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from typing import Any

import grpc

# Ids of workers, grants and requesters: short, printable, no path or shell characters.
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
# Versions and steps: uint64 on the wire, but anything near that is a forgery or a bug.
MAX_COUNTER = 2**53
# How far into the future a deadline / release time may lie (a day).
MAX_DEADLINE_AHEAD_S = 86_400.0


class InvalidArgument(ValueError):
    """A request field is missing or out of range (answered ``INVALID_ARGUMENT``)."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class Refused(ValueError):
    """A well-formed request that names something that does not exist (answered ``NOT_FOUND``)."""

    grpc_code = grpc.StatusCode.NOT_FOUND


def check_id(value: str, field: str, *, allowed: Iterable[str] | None = None, required: bool = True) -> str:
    """A worker / grant / requester id: non-empty (unless ``required=False``), of the id form, and one of
    ``allowed`` when that is given."""
    value = str(value)
    if not value:
        if required:
            raise InvalidArgument(f"{field} is required")
        return value
    if not _ID_RE.match(value):
        raise InvalidArgument(f"{field} {value[:80]!r} is not an id (letters, digits, _ . : -; at most 64)")
    if allowed is not None:
        allowed = set(allowed)
        if value not in allowed:
            raise InvalidArgument(f"{field} {value!r} is not a worker of this run (known: {sorted(allowed)})")
    return value


def check_enum(enum: Any, value: int, field: str, *, allowed: Iterable[int] | None = None) -> int:
    """A protobuf enum value that the enum defines (proto3 enums are open: any int arrives), optionally one
    of ``allowed``."""
    try:
        name = enum.Name(int(value))
    except ValueError:
        raise InvalidArgument(f"{field} {value!r} is not a valid value") from None
    if allowed is not None and int(value) not in set(allowed):
        raise InvalidArgument(f"{field} {name} is not allowed here")
    return int(value)


def check_counter(value: int, field: str, *, at_most: int | None = None, at_least: int = 0) -> int:
    """A version / step / count: an int in ``[at_least, at_most]`` (``at_most`` default ``MAX_COUNTER``)."""
    v = int(value)
    hi = MAX_COUNTER if at_most is None else min(int(at_most), MAX_COUNTER)
    if v < at_least:
        raise InvalidArgument(f"{field} {v} must be >= {at_least}")
    if v > hi:
        raise InvalidArgument(f"{field} {v} is ahead of what this run has reached (at most {hi})")
    return v


def check_number(
    value: float,
    field: str,
    *,
    lo: float = 0.0,
    hi: float = float("inf"),
    lo_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """A finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``; ``allow_inf``: +inf passes too)."""
    v = float(value)
    if allow_inf and v == math.inf:
        return v
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        bracket = "(" if lo_open else "["
        raise InvalidArgument(f"{field} {v!r} must be finite and in {bracket}{lo:g}, {hi:g}]")
    return v


def check_deadline(msg: Any, field: str, *, required: bool = True, now: float | None = None) -> float | None:
    """The ``google.protobuf.Timestamp`` field ``field`` of ``msg`` as ``time.time()`` seconds: present (when
    ``required``), not in the past, and at most ``MAX_DEADLINE_AHEAD_S`` ahead."""
    if not msg.HasField(field):
        if required:
            raise InvalidArgument(f"{field} is required")
        return None
    t = getattr(msg, field).ToNanoseconds() / 1e9
    now = time.time() if now is None else now
    if not math.isfinite(t) or t <= now:
        raise InvalidArgument(f"{field} lies in the past ({now - t:.3f} s ago)")
    if t > now + MAX_DEADLINE_AHEAD_S:
        raise InvalidArgument(f"{field} lies more than {MAX_DEADLINE_AHEAD_S:g} s ahead")
    return t


def check_address(value: str, field: str) -> str:
    """``host:port`` (or empty)."""
    if not value:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(value) > 300:
        raise InvalidArgument(f"{field} {value[:80]!r} is not host:port")
    if any(c.isspace() or c in "/\\" for c in host):
        raise InvalidArgument(f"{field} {value[:80]!r} is not host:port")
    return value


__all__ = [
    "MAX_COUNTER",
    "MAX_DEADLINE_AHEAD_S",
    "InvalidArgument",
    "Refused",
    "check_address",
    "check_counter",
    "check_deadline",
    "check_enum",
    "check_id",
    "check_number",
]

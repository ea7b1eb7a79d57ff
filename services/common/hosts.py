"""Which address a service binds and which one it advertises (``grpc.host``; see ``GrpcSection``).

The rule, in two halves:

- ``run_host(host, multi_node)`` (the driver, once per run): ``auto`` becomes ``node`` on a Ray cluster with
  more than one alive node, else ``127.0.0.1``; every other value is kept. ``multi_node()`` asks Ray.
- ``bind_and_advertise(host, node_ip)`` (each service, in its own process; ``node_ip`` is that process's Ray
  node IP, ``ray.util.get_node_ip_address()``, or None outside Ray):

  ==================================  ================================  ================================
  host                                binds                             advertises
  ==================================  ================================  ================================
  ``node``                            the node IP (127.0.0.1 w/o Ray)   the same
  a wildcard (``0.0.0.0``, ``::``)    the wildcard                      the node IP (127.0.0.1 w/o Ray)
  ``auto``                            as ``node`` on a multi-node       the same
                                      cluster, else ``127.0.0.1``
  anything else (an IP, a hostname)   it                                it
  ==================================  ================================  ================================

So a single-node run and a ``ray.use_ray=false`` run keep ``127.0.0.1``; on several nodes every service binds
its own node's address, and the address it hands out (``GetStatus``, the coordinator's registry, the clients
the driver and the other actors dial) is one the other nodes can reach, never a wildcard or loopback.
"""

from __future__ import annotations

AUTO = "auto"
NODE = "node"
LOOPBACK = "127.0.0.1"
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]", ""})


def run_host(host: str | None, multi_node: bool) -> str:
    """The driver's half: ``auto`` (or None) -> ``node`` when ``multi_node`` else ``127.0.0.1``."""
    h = (host or AUTO).strip()
    if h.lower() == AUTO:
        return NODE if multi_node else LOOPBACK
    return h


def bind_and_advertise(host: str | None, node_ip: str | None, multi_node: bool = False) -> tuple[str, str]:
    """The service's half: ``(bind host, advertised host)`` for ``host`` on a node whose IP is ``node_ip``
    (None outside Ray). ``auto`` here (a service started without the driver's resolution) is resolved with
    ``multi_node``."""
    h = (host if host is not None else AUTO).strip()
    if h.lower() == AUTO:
        h = run_host(h, multi_node)
    if h.lower() == NODE:
        ip = node_ip or LOOPBACK
        return ip, ip
    if h in WILDCARDS:
        return (h or "0.0.0.0"), (node_ip or LOOPBACK)
    return h, h


def ray_node_ip() -> str | None:
    """This process's Ray node IP, or None when Ray is not initialized here."""
    try:
        import ray
    except ImportError:  # pragma: no cover
        return None
    if not ray.is_initialized():
        return None
    return ray.util.get_node_ip_address()


def multi_node() -> bool:
    """True when Ray is initialized here and its cluster has more than one alive node."""
    try:
        import ray
    except ImportError:  # pragma: no cover
        return False
    if not ray.is_initialized():
        return False
    return sum(1 for n in ray.nodes() if n.get("Alive")) > 1


def resolve(host: str | None) -> tuple[str, str]:
    """``bind_and_advertise`` with this process's Ray facts (``multi_node`` is asked only for ``auto``)."""
    h = (host if host is not None else AUTO).strip().lower()
    return bind_and_advertise(host, ray_node_ip(), multi_node() if h == AUTO else False)


def format_address(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


__all__ = [
    "AUTO",
    "LOOPBACK",
    "NODE",
    "WILDCARDS",
    "bind_and_advertise",
    "format_address",
    "multi_node",
    "ray_node_ip",
    "resolve",
    "run_host",
]

"""gRPC serving for tailspec services: a ``grpc.aio`` server on its own thread, with health and token auth.

Every actor serves its control-plane service (``protos/tailspec/v1``) with ``GrpcServer``. The server runs in
a background thread with its own event loop, so a plain synchronous Python object, a sync Ray actor and an
async Ray actor can all host it without giving up their own thread or loop::

    from services.common.grpc_client import channel
    from services.common.grpc_server import GrpcServer, expose
    from services.common.proto_gen.tailspec.v1 import coordinator_pb2, coordinator_pb2_grpc

    server = GrpcServer([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, coordinator)], port=50051,
                        token=token)
    port = server.start()                      # bound port (useful with port=0)
    with channel(f"127.0.0.1:{port}", token) as ch:
        status = coordinator_pb2_grpc.CoordinatorServiceStub(ch).GetStatus(common_pb2.GetStatusRequest())
    server.stop()

- ``servicers``: instances of generated ``...Servicer`` subclasses, written by hand (``async def`` methods,
  or plain ``def`` ones that must not block) or built by ``expose(servicer_base, obj)`` from any object whose
  methods are named like the RPCs (``GetStatus`` or ``get_status``), take the request message and return
  the response message (or a dict in its JSON shape). ``obj`` may be a Ray actor handle: then
  ``obj.get_status.remote(request)`` is awaited.
- Health: the standard ``grpc.health.v1.Health`` service answers SERVING for ``""`` and for each service's
  full name (``tailspec.v1.CoordinatorService``) while the server runs; ``set_serving(name, False)`` flips
  one, ``stop()`` flips all to NOT_SERVING before shutting down.
- Security (``services/common/grpc_auth.py``): bound to ``127.0.0.1`` by default. A non-loopback host
  (``0.0.0.0``, a pod IP, a hostname) is refused with ``ValueError`` unless a ``token`` or ``tls`` is
  configured. With a token, every call (health included, unless ``public_health=True`` for Kubernetes gRPC
  probes, which cannot send metadata) must carry ``authorization: Bearer <token>`` metadata, else it fails
  with ``UNAUTHENTICATED``. With ``tls`` the port is a TLS port (optionally requiring client certificates).
- Clients (``services/common/grpc_client.py``): ``channel(address, token)`` adds the metadata.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_auth import (
    DEFAULT_HOST,
    TlsConfig,
    TokenAuthInterceptor,
    check_bind,
)
from services.common.hosts import format_address, resolve

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"

# Exception type -> status code used by `expose` (first match in MRO order of this mapping wins). An
# exception may also carry its own code as attribute `grpc_code` (a grpc.StatusCode).
DEFAULT_ERROR_CODES: dict[type[BaseException], grpc.StatusCode] = {
    NotImplementedError: grpc.StatusCode.UNIMPLEMENTED,
    PermissionError: grpc.StatusCode.PERMISSION_DENIED,
    TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    KeyError: grpc.StatusCode.NOT_FOUND,
    LookupError: grpc.StatusCode.NOT_FOUND,
    ValueError: grpc.StatusCode.INVALID_ARGUMENT,
    TypeError: grpc.StatusCode.INVALID_ARGUMENT,
}


# ---------------------------------------------------------------------------------------------- servicers
@dataclass(frozen=True)
class ServiceBinding:
    """A servicer plus how to register it: ``add_fn(servicer, server)`` and the full service name."""

    servicer: Any
    add_fn: Callable[[Any, Any], None]
    service_name: str


def _generated_base(cls: type) -> type:
    for base in cls.__mro__:
        mod = sys.modules.get(base.__module__)
        if (
            base.__name__.endswith("Servicer")
            and base.__module__.endswith("_pb2_grpc")
            and mod is not None
            and hasattr(mod, f"add_{base.__name__}_to_server")
        ):
            return base
    raise TypeError(
        f"{cls.__name__} is not a subclass of a generated gRPC servicer (a ...Servicer class of a *_pb2_grpc "
        "module); pass it as ServiceBinding(servicer, add_fn, service_name) instead"
    )


def _service_descriptor(base: type):
    pb2_name = base.__module__[: -len("_grpc")]
    pb2 = sys.modules.get(pb2_name) or __import__(pb2_name, fromlist=["DESCRIPTOR"])
    name = base.__name__[: -len("Servicer")]
    try:
        return pb2.DESCRIPTOR.services_by_name[name]
    except KeyError:
        raise TypeError(f"service {name!r} not found in {pb2_name}") from None


def binding_for(servicer: Any) -> ServiceBinding:
    """``ServiceBinding`` of a generated-servicer instance (or the binding itself)."""
    if isinstance(servicer, ServiceBinding):
        return servicer
    base = _generated_base(type(servicer))
    mod = sys.modules[base.__module__]
    return ServiceBinding(
        servicer, getattr(mod, f"add_{base.__name__}_to_server"), _service_descriptor(base).full_name
    )


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if (
            ch.isupper()
            and i
            and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower()))
        ):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _is_ray_actor_handle(obj: Any) -> bool:
    return type(obj).__name__ == "ActorHandle" and type(obj).__module__.startswith("ray.")


def _status_code_for(exc: BaseException, error_codes: Mapping[type[BaseException], grpc.StatusCode]):
    code = getattr(exc, "grpc_code", None)
    if isinstance(code, grpc.StatusCode):
        return code
    for cls in type(exc).__mro__:
        if cls in error_codes:
            return error_codes[cls]
    return grpc.StatusCode.INTERNAL


def expose(
    servicer_base: type,
    impl: Any,
    *,
    lock: threading.Lock | threading.RLock | None = None,
    error_codes: Mapping[type[BaseException], grpc.StatusCode] | None = None,
) -> Any:
    """A servicer (instance of a subclass of the generated ``servicer_base``) whose unary RPCs call ``impl``.

    For RPC ``GetStatus`` it calls ``impl.GetStatus(request)`` or ``impl.get_status(request)``; an RPC that
    ``impl`` lacks answers UNIMPLEMENTED. The result may be the response message, a dict in its JSON shape
    (``json_format.ParseDict``) or None (empty response).

    - Plain objects: calls run in a worker thread (the event loop stays free for health checks) under
      ``lock`` — by default one lock per exposed object, so gRPC calls into it never overlap; pass the lock
      the host's own code uses to serialize against that too. ``async def`` methods are awaited on the
      server's loop instead (no lock).
    - Ray actor handles: ``impl.<method>.remote(request)`` is awaited (the actor serializes its calls).
    - Errors: an exception becomes an RPC error: its ``grpc_code`` attribute if set, else the first match of
      its type in ``error_codes`` (default ``DEFAULT_ERROR_CODES``: ValueError -> INVALID_ARGUMENT,
      KeyError -> NOT_FOUND, ...), else INTERNAL; the details are ``"<ExceptionType>: <message>"``.
    """
    base = _generated_base(servicer_base)
    desc = _service_descriptor(base)
    codes = dict(DEFAULT_ERROR_CODES if error_codes is None else error_codes)
    is_actor = _is_ray_actor_handle(impl)
    call_lock = lock if lock is not None else threading.Lock()
    methods: dict[str, Any] = {}

    for mdesc in desc.methods:
        if mdesc.client_streaming or mdesc.server_streaming:
            continue  # streaming RPCs need a hand-written servicer method
        target = None
        for attr in (mdesc.name, _snake(mdesc.name)):
            if is_actor:
                try:
                    target = getattr(impl, attr)
                except AttributeError:
                    target = None
            else:
                target = getattr(impl, attr, None)
            if target is not None:
                break
        out_cls = message_factory.GetMessageClass(mdesc.output_type)
        methods[mdesc.name] = _make_handler(mdesc.full_name, target, out_cls, is_actor, call_lock, codes)

    cls = type(f"Exposed{base.__name__}", (base,), methods)
    servicer = cls()
    servicer.impl = impl
    return servicer


def _make_handler(full_name, target, out_cls, is_actor, call_lock, codes):
    async def handler(self, request, context):
        if target is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, f"{full_name} is not implemented by this server"
            )
        try:
            if is_actor:
                result = await target.remote(request)
            elif inspect.iscoroutinefunction(target):
                result = await target(request)
            else:

                def locked_call():
                    with call_lock:
                        return target(request)

                result = await asyncio.get_running_loop().run_in_executor(None, locked_call)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status code
            code = _status_code_for(exc, codes)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("%s failed", full_name)
            await context.abort(code, f"{type(exc).__name__}: {exc}")
        try:
            return _to_message(result, out_cls)
        except Exception as exc:  # noqa: BLE001 - a bad return value is a server bug
            log.exception("%s returned an unusable value", full_name)
            await context.abort(grpc.StatusCode.INTERNAL, f"{full_name} returned {type(exc).__name__}: {exc}")

    handler.__name__ = full_name.rsplit(".", 1)[-1]
    return handler


def _to_message(result: Any, out_cls: type) -> Message:
    if result is None:
        return out_cls()
    if isinstance(result, out_cls):
        return result
    if isinstance(result, Mapping):
        return json_format.ParseDict(dict(result), out_cls())
    raise TypeError(f"expected {out_cls.DESCRIPTOR.full_name} (or a dict), got {type(result).__name__}")


# ---------------------------------------------------------------------------------------------- server
class GrpcServer:
    """A ``grpc.aio`` server with the health service, on a background thread with its own event loop.

    Args:
        servicers: generated-servicer instances (hand-written or from ``expose``) or ``ServiceBinding``s.
        host: bind address; non-loopback needs ``token`` or ``tls`` (else ``ValueError`` here). ``auto``,
            ``node`` and wildcards follow ``services/common/hosts.py``: ``node`` binds this process's Ray
            node IP, a wildcard advertises it (``address``), ``auto`` is ``node`` on a multi-node cluster.
        port: 0 = any free port (``start()`` returns it).
        token: bearer token every call must carry (metadata ``authorization: Bearer <token>``).
        tls: serve TLS instead of plaintext.
        public_health: let health checks through without the token (Kubernetes gRPC probes).
        options: extra ``grpc.aio.server`` channel options.
    """

    def __init__(
        self,
        servicers: Sequence[Any],
        host: str = DEFAULT_HOST,
        port: int = 0,
        token: str | None = None,
        tls: TlsConfig | None = None,
        *,
        public_health: bool = False,
        options: Sequence[tuple[str, Any]] = (),
        name: str = "grpc",
    ):
        if not (0 <= int(port) <= 65535):
            raise ValueError(f"port must be in 0..65535, got {port!r}")
        requested = host
        host, advertise = resolve(host)  # ``auto``, ``node`` and wildcards: services/common/hosts.py
        check_bind(host, token, tls)
        self.bindings = [binding_for(s) for s in servicers]
        names = [b.service_name for b in self.bindings]
        if len(set(names)) != len(names):
            raise ValueError(f"a service is registered twice: {names}")
        self.requested_host = requested
        self.host = host  # what is bound
        self.advertise_host = advertise  # what others dial (``address``)
        self.requested_port = int(port)
        self.token = token or None
        self.tls = tls
        self.public_health = public_health
        self.options = list(options)
        self.name = name
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._error: BaseException | None = None
        self._stopped = False

    # -- properties
    @property
    def service_names(self) -> list[str]:
        return [b.service_name for b in self.bindings]

    @property
    def address(self) -> str:
        """``host:port`` to dial (``[::1]:port`` style for IPv6): the advertised host, so a wildcard bind is
        reported as the Ray node's IP (``127.0.0.1`` outside Ray), never as ``0.0.0.0``."""
        if self.port is None:
            raise RuntimeError("server not started")
        return format_address(self.advertise_host, self.port)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopped

    # -- lifecycle
    def start(self, timeout: float = 30.0) -> int:
        """Bind, start serving, mark all services SERVING; returns the bound port. Raises what binding raised."""
        if self._thread is not None:
            raise RuntimeError("GrpcServer.start() called twice")
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=f"{self.name}-server", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(
                f"gRPC server on {self.host}:{self.requested_port} did not start in {timeout}s"
            )
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error
        assert self.port is not None
        return self.port

    def stop(self, grace: float | None = 1.0) -> None:
        """Health to NOT_SERVING, stop accepting calls, give in-flight ones ``grace`` seconds, end the thread.
        Idempotent."""
        if self._thread is None or self._stopped:
            return
        self._stopped = True
        loop = self._loop
        if loop is not None and loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(grace), loop)
            try:
                fut.result(timeout=(grace or 0) + 10)
            except Exception:  # noqa: BLE001 - stopping must not raise from a half-dead server
                log.exception("error while stopping gRPC server %s", self.name)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=(grace or 0) + 10)

    def __enter__(self) -> GrpcServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_serving(self, service: str, serving: bool = True) -> None:
        """Set the health status of ``service`` (full name, or "" for the whole server)."""
        if self._loop is None or not self.running:
            raise RuntimeError("server not running")
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        asyncio.run_coroutine_threadsafe(self._health.set(service, status), self._loop).result(timeout=10)

    # -- event-loop side
    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._startup())
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            self._error = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    async def _startup(self) -> None:
        interceptors = []
        if self.token:
            exempt = (f"/{HEALTH_SERVICE}/",) if self.public_health else ()
            interceptors.append(TokenAuthInterceptor(self.token, exempt))
        server = grpc.aio.server(interceptors=interceptors, options=self.options)
        self._health = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        for b in self.bindings:
            b.add_fn(b.servicer, server)
        host = self.host if not (":" in self.host and not self.host.startswith("[")) else f"[{self.host}]"
        bind = f"{host}:{self.requested_port}"
        try:
            if self.tls is not None:
                port = server.add_secure_port(bind, self.tls.server_credentials())
            else:
                port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise OSError(f"cannot bind gRPC server to {bind}: {exc}") from exc
        if not port:
            raise OSError(f"cannot bind gRPC server to {bind}")
        await server.start()
        for name in ["", *self.service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.port = port
        log.info("gRPC %s serving %s on %s:%d", self.name, ", ".join(self.service_names), self.host, port)

    async def _shutdown(self, grace: float | None) -> None:
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)


__all__ = [
    "DEFAULT_ERROR_CODES",
    "HEALTH_SERVICE",
    "GrpcServer",
    "ServiceBinding",
    "binding_for",
    "expose",
]

"""Another process on the machine, calling a run's gRPC services (run as ``python -m tests.security.attacker``).

Reads one JSON document on stdin and prints one on stdout:

- ``{"mode": "every_rpc", "targets": {service full name: [address, ...]}, "token": str | null}``: calls every
  RPC of every service defined in the generated ``*_pb2_grpc`` modules (and the health check) at every
  address given for it, with an empty request, once without metadata and once with ``token`` (a wrong one);
  answers ``{"services": [every service full name found], "codes": {"Service/Method@address": [code, code]}}``.
- ``{"mode": "calls", "token": str, "calls": [{"service", "method", "address", "request": JSON}]}``: each call
  with the request in its JSON shape; answers ``{"codes": [code name, ...], "details": [str, ...]}``.

Nothing here imports the services themselves: only the generated protobuf modules, as a stranger would.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

import grpc
from google.protobuf import json_format, message_factory

import services.common.proto_gen.tailspec.v1 as proto_pkg

HEALTH = "grpc.health.v1.Health"


def service_descriptors() -> dict:
    """Full name -> ServiceDescriptor of every service of the generated ``*_pb2_grpc`` modules."""
    out = {}
    for mod in pkgutil.iter_modules(proto_pkg.__path__):
        if not mod.name.endswith("_pb2_grpc"):
            continue
        importlib.import_module(f"{proto_pkg.__name__}.{mod.name}")
        pb2 = importlib.import_module(f"{proto_pkg.__name__}.{mod.name.removesuffix('_grpc')}")
        for svc in pb2.DESCRIPTOR.services_by_name.values():
            out[svc.full_name] = svc
    return out


def _call(ch: grpc.Channel, service: str, mdesc, request, metadata, timeout: float = 10.0):
    in_cls = message_factory.GetMessageClass(mdesc.input_type)
    out_cls = message_factory.GetMessageClass(mdesc.output_type)
    path = f"/{service}/{mdesc.name}"
    kw = dict(request_serializer=in_cls.SerializeToString, response_deserializer=out_cls.FromString)
    if request is None:
        request = in_cls()
    if mdesc.client_streaming and mdesc.server_streaming:
        return list(ch.stream_stream(path, **kw)(iter([request]), metadata=metadata, timeout=timeout))
    if mdesc.client_streaming:
        return ch.stream_unary(path, **kw)(iter([request]), metadata=metadata, timeout=timeout)
    if mdesc.server_streaming:
        return list(ch.unary_stream(path, **kw)(request, metadata=metadata, timeout=timeout))
    return ch.unary_unary(path, **kw)(request, metadata=metadata, timeout=timeout)


def _code(*call) -> tuple[str, str]:
    """The status code name (and details) of ``_call(*call)``."""
    try:
        _call(*call)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""
    return "OK", ""


def every_rpc(targets: dict, token: str | None) -> dict:
    descs = service_descriptors()
    codes = {}
    attempts = [None, (("authorization", f"Bearer {token}"),)] if token else [None]
    for name, svc in descs.items():
        for address in targets.get(name, []):
            with grpc.insecure_channel(address) as ch:
                for m in svc.methods:
                    codes[f"{name}/{m.name}@{address}"] = [_code(ch, name, m, None, md)[0] for md in attempts]
    from grpc_health.v1 import health_pb2

    health = health_pb2.DESCRIPTOR.services_by_name["Health"]
    for address in sorted({a for addrs in targets.values() for a in addrs}):
        with grpc.insecure_channel(address) as ch:
            m = health.methods_by_name["Check"]
            codes[f"{HEALTH}/Check@{address}"] = [_code(ch, HEALTH, m, None, md)[0] for md in attempts]
    return {"services": sorted(descs), "codes": codes}


def calls(spec: list, token: str) -> dict:
    descs = service_descriptors()
    md = (("authorization", f"Bearer {token}"),)
    codes, details = [], []
    for c in spec:
        mdesc = descs[c["service"]].methods_by_name[c["method"]]
        req = json_format.ParseDict(
            c.get("request") or {}, message_factory.GetMessageClass(mdesc.input_type)()
        )
        with grpc.insecure_channel(c["address"]) as ch:
            code, det = _code(ch, c["service"], mdesc, req, md)
        codes.append(code)
        details.append(det)
    return {"codes": codes, "details": details}


def main() -> None:
    doc = json.load(sys.stdin)
    if doc["mode"] == "every_rpc":
        out = every_rpc(doc["targets"], doc.get("token"))
    elif doc["mode"] == "calls":
        out = calls(doc["calls"], doc["token"])
    else:
        raise SystemExit(f"unknown mode {doc['mode']!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""GrpcServer: round trip, health, token auth, bind policy, error mapping, TLS, asyncio clients."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress

import grpc
import pytest

from services.common.grpc_auth import TlsConfig, is_loopback
from services.common.grpc_client import aio_channel, channel, health_check
from services.common.grpc_server import GrpcServer, expose
from services.common.proto_gen.tailspec.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    tuner_pb2_grpc,
)
from tests.common.fake_services import FakeCoordinator, FakeRollout

TOKEN = "test-token-1234"


@pytest.fixture
def servers():
    started: list[GrpcServer] = []

    def make(*args, **kw) -> GrpcServer:
        srv = GrpcServer(*args, **kw)
        srv.start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop(grace=0.2)


def _status(address: str, token: str | None = None, **kw) -> coordinator_pb2.CoordinatorStatus:
    with channel(address, token, **kw) as ch:
        return coordinator_pb2_grpc.CoordinatorServiceStub(ch).GetStatus(
            common_pb2.GetStatusRequest(), timeout=10
        )


def test_round_trip_and_health(servers):
    coord = FakeCoordinator()
    srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, coord), FakeRollout()], port=0)
    assert srv.port and srv.port > 0 and srv.address == f"127.0.0.1:{srv.port}"
    assert srv.service_names == ["tailspec.v1.CoordinatorService", "tailspec.v1.RolloutService"]

    status = _status(srv.address)
    assert status.rl_step == 4
    assert {w.worker_id for w in status.workers} == {"rollout-0", "rollout-1", "rollout-2"}
    assert {w.worker_id: w.state for w in status.workers}["rollout-1"] == common_pb2.WORKER_STATE_TRAINING

    with channel(srv.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(ch)
        reg = stub.Register(
            coordinator_pb2.RegisterRequest(worker_id="w9", role=common_pb2.WORKER_ROLE_ROLLOUT)
        )
        assert reg.state == common_pb2.WORKER_STATE_STARTING
        rep = stub.ReportState(
            coordinator_pb2.ReportStateRequest(worker_id="w9", state=common_pb2.WORKER_STATE_IDLE)
        )
        assert rep.accepted and rep.state == common_pb2.WORKER_STATE_IDLE  # dict response parsed
        assert coord.workers["w9"].state == common_pb2.WORKER_STATE_IDLE
        rollout = rollout_pb2_grpc.RolloutServiceStub(ch)
        set_resp = rollout.SetStrategyTable(
            rollout_pb2.SetStrategyTableRequest(table=common_pb2.StrategyTable(version=2))
        )
        assert set_resp.accepted and set_resp.active_version == 2
        assert rollout.GetStatus(common_pb2.GetStatusRequest()).versions.strategy_table_version == 2

    for service in ("", "tailspec.v1.CoordinatorService", "tailspec.v1.RolloutService"):
        assert health_check(srv.address, service) == "SERVING"
    with pytest.raises(grpc.RpcError) as err:
        health_check(srv.address, "tailspec.v1.TunerService")  # not served here
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    srv.set_serving("tailspec.v1.RolloutService", False)
    assert health_check(srv.address, "tailspec.v1.RolloutService") == "NOT_SERVING"


def test_expose_maps_errors_and_missing_methods(servers):
    class Impl(FakeCoordinator):
        def heartbeat(self, req):
            raise RuntimeError("boom")

        def request_resources(self, req):
            err = RuntimeError("no idle workers")
            err.grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
            raise err

    srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, Impl())])
    with channel(srv.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(ch)
        cases = [
            (stub.Register, coordinator_pb2.RegisterRequest(), grpc.StatusCode.INVALID_ARGUMENT, "worker_id"),
            (
                stub.ReportState,
                coordinator_pb2.ReportStateRequest(worker_id="nope"),
                grpc.StatusCode.NOT_FOUND,
                "nope",
            ),
            (stub.Heartbeat, coordinator_pb2.HeartbeatRequest(), grpc.StatusCode.INTERNAL, "boom"),
            (
                stub.RequestResources,
                coordinator_pb2.RequestResourcesRequest(),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "no idle",
            ),
        ]
        for call, req, code, text in cases:
            with pytest.raises(grpc.RpcError) as err:
                call(req, timeout=10)
            assert err.value.code() == code, (call, err.value.details())
            assert text in err.value.details()
    # a method the object lacks: UNIMPLEMENTED (tuner has no get_strategy_table here)
    srv2 = servers([expose(tuner_pb2_grpc.TunerServiceServicer, object())])
    with channel(srv2.address) as ch, pytest.raises(grpc.RpcError) as err:
        tuner_pb2_grpc.TunerServiceStub(ch).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_token_auth_rejects_calls_without_token(servers):
    # Bound off loopback: allowed only because a token is configured.
    srv = servers(
        [expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())],
        host="0.0.0.0",
        token=TOKEN,
    )
    addr = f"127.0.0.1:{srv.port}"
    for token in (None, "wrong-token"):
        with pytest.raises(grpc.RpcError) as err:
            _status(addr, token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            health_check(addr, token=token)  # health is protected too (public_health=False)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _status(addr, TOKEN).rl_step == 4
    assert health_check(addr, "tailspec.v1.CoordinatorService", token=TOKEN) == "SERVING"


def test_public_health_lets_probes_through(servers):
    srv = servers([FakeRollout()], token=TOKEN, public_health=True)
    assert health_check(srv.address) == "SERVING"
    with channel(srv.address) as ch, pytest.raises(grpc.RpcError) as err:
        rollout_pb2_grpc.RolloutServiceStub(ch).GetStatus(common_pb2.GetStatusRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "coordinator.svc"])
def test_non_loopback_bind_without_auth_raises(host):
    with pytest.raises(ValueError, match="token.*TLS"):
        GrpcServer([FakeRollout()], host=host, port=0)


def test_is_loopback():
    assert (
        is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("[::1]")
    )
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("example.org")


def test_duplicate_service_and_bad_servicer_rejected():
    with pytest.raises(ValueError, match="twice"):
        GrpcServer([FakeRollout(), FakeRollout()])
    with pytest.raises(TypeError, match="generated gRPC servicer"):
        GrpcServer([object()])


def test_port_in_use_raises_and_stop_is_idempotent(servers):
    srv = servers([FakeRollout()])
    other = GrpcServer([FakeRollout()], port=srv.port, options=[("grpc.so_reuseport", 0)])
    with pytest.raises(OSError):
        other.start()
    srv.stop()
    srv.stop()
    assert not srv.running


def test_aio_channel_with_token(servers):
    srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], token=TOKEN)

    async def call():
        async with aio_channel(srv.address, TOKEN) as ch:
            return await coordinator_pb2_grpc.CoordinatorServiceStub(ch).GetStatus(
                common_pb2.GetStatusRequest(), timeout=10
            )

    assert asyncio.run(call()).rl_step == 4


def test_async_impl_methods_are_awaited(servers):
    class AsyncCoord:
        async def get_status(self, req):
            await asyncio.sleep(0)
            return coordinator_pb2.CoordinatorStatus(rl_step=11)

    srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, AsyncCoord())])
    assert _status(srv.address).rl_step == 11


def _self_signed_cert():
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_tls_server(servers, tmp_path):
    cert, key = _self_signed_cert()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    tls = TlsConfig(cert_chain=tmp_path / "cert.pem", private_key=tmp_path / "key.pem")
    # TLS alone permits a non-loopback host
    GrpcServer([FakeRollout()], host="0.0.0.0", tls=tls)
    srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, FakeCoordinator())], tls=tls)
    addr = f"localhost:{srv.port}"
    assert _status(addr, tls_root_certificates=cert).rl_step == 4
    with pytest.raises(grpc.RpcError) as err:
        _status(addr)  # plaintext against a TLS port
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_ray_actor_hosts_server_and_handles_are_exposed(ray_cluster, servers):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class CoordinatorActor:
        """A thin actor around the plain core, serving it over gRPC from inside the actor."""

        def __init__(self):
            from services.common.grpc_server import GrpcServer, expose
            from services.common.proto_gen.tailspec.v1 import coordinator_pb2_grpc
            from tests.common.fake_services import FakeCoordinator

            self.core = FakeCoordinator()
            self.server = GrpcServer([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, self.core)])
            self.server.start()

        def address(self) -> str:
            return self.server.address

        def get_status(self, request):
            return self.core.get_status(request)

        def stop(self) -> None:
            self.server.stop(grace=0.2)

    actor = CoordinatorActor.remote()
    try:
        # served from inside the actor
        assert _status(ray.get(actor.address.remote())).rl_step == 4
        # an actor handle exposed by a server in this process: calls become actor.get_status.remote(...)
        srv = servers([expose(coordinator_pb2_grpc.CoordinatorServiceServicer, actor)])
        assert {w.worker_id for w in _status(srv.address).workers} == {"rollout-0", "rollout-1", "rollout-2"}
        with channel(srv.address) as ch, pytest.raises(grpc.RpcError) as err:
            coordinator_pb2_grpc.CoordinatorServiceStub(ch).Heartbeat(
                coordinator_pb2.HeartbeatRequest(), timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        ray.get(actor.stop.remote())
    finally:
        ray.kill(actor)

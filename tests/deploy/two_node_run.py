"""The driver of ``test_two_node.py``: a short tailspec run on a running Ray cluster, recording where each
service is and what it advertises. Not a test module; run as

    python -m tests.deploy.two_node_run OUT_JSON NODES [key=value ...]

It joins ``ray.address`` (from the overrides), waits for ``NODES`` alive nodes, then runs ``RLDriver`` with one
hook after the services start: for every service actor, its node's IP as Ray's GCS records it (actor table ->
node id -> the node's address), the address the control plane dials, the coordinator's ``GetStatus`` (its own
address and every rollout actor's registered address), and a health check of every gRPC address from here
(reachable, with the run's token). Exits with the CLI's status; the record is written before the run goes on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    out, nodes_wanted, overrides = Path(argv[0]), int(argv[1]), argv[2:]
    import ray

    from services.common.config import load_config
    from services.common.grpc_client import channel, health_check
    from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2_grpc
    from services.common.ray_utils import init_ray
    from services.pipeline.driver import RLDriver

    run_dir = Path(overrides.pop(overrides.index("--run-dir") + 1))
    overrides.remove("--run-dir")
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "gsm8k_tiny.yaml", overrides)
    init_ray(cfg.ray.address)
    deadline = time.monotonic() + 120
    while sum(n["Alive"] for n in ray.nodes()) < nodes_wanted:
        if time.monotonic() > deadline:
            print(
                f"only {sum(n['Alive'] for n in ray.nodes())} of {nodes_wanted} nodes came up",
                file=sys.stderr,
            )
            return 3
        time.sleep(1)

    def node_ip_of(handle) -> str:
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        info = ray._private.state.actors(handle._actor_id.hex())
        return ips[info["Address"]["NodeID"]]

    class Probe(RLDriver):
        def _start_services(self) -> None:
            super()._start_services()
            plane = self.plane
            services = [("coordinator", plane.coordinator_address, plane.coordinator_pool.members[0])]
            services.append(("tuner", plane.tuner_client.address, plane.tuner.members[0]))
            services += [
                (f"rollout-{i}", c.address, plane.rollout.members[i])
                for i, c in enumerate(plane.rollout_clients)
            ]
            services += [
                (f"spot-{i}", c.address, plane.spot.members[i]) for i, c in enumerate(plane.spot_clients)
            ]
            streams = plane.spot.call_all("address", [()] * len(plane.spot))
            services += [(f"spot-stream-{i}", a, plane.spot.members[i]) for i, a in enumerate(streams)]
            record = {
                "nodes": sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]),
                "host": plane.host,
                "services": [
                    {"name": name, "address": addr, "node_ip": node_ip_of(h)} for name, addr, h in services
                ],
                "trainer_node_ip": node_ip_of(self.trainer.members[0]),
                "trainer_bundle": self.placement.trainer_bundle,
                "health": {},
            }
            for s in record["services"]:
                if not s["name"].startswith("spot-stream"):
                    record["health"][s["name"]] = health_check(s["address"], token=plane.token, timeout=30)
            with channel(plane.coordinator_address, plane.token) as ch:
                st = coordinator_pb2_grpc.CoordinatorServiceStub(ch).GetStatus(
                    common_pb2.GetStatusRequest(), timeout=30
                )
            record["status"] = {
                "coordinator": st.info.address,
                "workers": {w.worker_id: w.address for w in st.workers},
            }
            out.write_text(json.dumps(record, indent=1))

    summary = Probe(cfg, run_dir=run_dir).run()
    print(f"done: {summary['steps']} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

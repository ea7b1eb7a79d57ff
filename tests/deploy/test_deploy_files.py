"""Static checks of deploy/: the runtime env is one Ray accepts, the Prometheus config scrapes Ray's service
discovery file, the Dockerfile installs what `make setup` installs, and the README's commands are the real ones."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from services.common.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def test_runtime_env_is_valid_for_ray():
    from ray.runtime_env import RuntimeEnv

    raw = yaml.safe_load((DEPLOY / "runtime_env.yaml").read_text())
    env = RuntimeEnv(**raw)  # raises on unknown fields or wrong types
    assert env["working_dir"] == "."
    for pattern in (".venv", "runs", ".git", "**/__pycache__", ".pytest_cache"):
        assert pattern in raw["excludes"], pattern
    # the driver's ray.init(runtime_env={"env_vars": {"PYTHONPATH": ...}}) would conflict with it
    assert "PYTHONPATH" not in raw.get("env_vars", {})
    assert all(isinstance(v, str) for v in raw["env_vars"].values())


def test_prometheus_config():
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"ray", "tailspec-driver"}
    (sd,) = jobs["ray"]["file_sd_configs"]
    assert sd["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
    assert re.fullmatch(r"\d+[smh]", cfg["global"]["scrape_interval"])
    for target in jobs["tailspec-driver"]["static_configs"][0]["targets"]:
        host, port = target.rsplit(":", 1)
        assert host and 0 < int(port) < 65536


def test_ray_writes_the_service_discovery_file_we_scrape():
    from ray._private import ray_constants

    assert ray_constants.PROMETHEUS_SERVICE_DISCOVERY_FILE == "prom_metrics_service_discovery.json"


def test_dockerfile():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    torch = next(i for i, line in enumerate(lines) if "torch==2.13.0" in line)
    reqs = next(i for i, line in enumerate(lines) if "-r requirements.txt" in line)
    copy_all = lines.index("COPY . .")
    assert torch < reqs < copy_all  # torch (CPU) first, then the pins, then the code (layer caching)
    assert any(line.startswith("WORKDIR /app") for line in lines)
    assert "TAILSPEC_DATA_DIR=/data/gsm8k" in text and "COPY data/gsm8k /data/gsm8k" in text
    # self-contained: the image needs no build context beside the repository
    assert "--build-context" not in text and "shared" not in text
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "runs"} <= set(ignore)


def _readme_commands(prefix: str) -> list[str]:
    """Shell commands of deploy/README.md's code blocks that start with ``prefix`` (continuations joined)."""
    text = (DEPLOY / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        out += [line.strip() for line in joined.splitlines() if line.strip().startswith(prefix)]
    return out


def test_readme_ray_job_submit_command():
    (cmd,) = _readme_commands("ray job submit --address")
    argv = shlex.split(cmd.replace("$PWD", str(REPO)))
    sep = argv.index("--")
    opts, entry = argv[:sep], argv[sep + 1 :]
    assert opts[opts.index("--address") + 1] == "http://127.0.0.1:8265"
    assert opts[opts.index("--runtime-env") + 1] == "deploy/runtime_env.yaml"
    assert (REPO / opts[opts.index("--runtime-env") + 1]).is_file()
    assert entry[:4] == ["python", "-m", "services.pipeline.cli", "train"]
    config = entry[entry.index("--config") + 1]
    overrides = [a for a in entry[4:] if "=" in a and not a.startswith("-")]
    assert overrides == ["trainer.steps=1"]
    assert load_config(REPO / config, overrides).trainer.steps == 1  # the documented job config loads
    assert Path(entry[entry.index("--run-dir") + 1]).is_absolute()
    (start,) = _readme_commands("ray start --head")
    assert "--dashboard-port=8265" in start and "--metrics-export-port=8080" in start


def test_readme_ray_start_sets_every_port():
    """Two Ray clusters on one host must not clash: the documented ``ray start`` names every port Ray would
    otherwise pick by default (and a temp dir), each port once."""
    (start,) = _readme_commands("ray start --head")
    opts = dict(a.split("=", 1) for a in shlex.split(start)[3:] if a.startswith("--") and "=" in a)
    ports = [
        "--port",
        "--dashboard-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--ray-client-server-port",
        "--runtime-env-agent-port",
        "--node-manager-port",
        "--object-manager-port",
        "--min-worker-port",
        "--max-worker-port",
    ]
    missing = [k for k in ports + ["--temp-dir"] if k not in opts]
    assert not missing, missing
    fixed = [int(opts[k]) for k in ports[:-2]]
    assert len(set(fixed)) == len(fixed)
    lo, hi = int(opts["--min-worker-port"]), int(opts["--max-worker-port"])
    assert lo < hi and not any(lo <= p <= hi for p in fixed)


def test_readme_mentions_token_auth_and_chart():
    text = (DEPLOY / "README.md").read_text()
    for needle in (
        "export RAY_AUTH_MODE=token",
        "ray get-auth-token --generate",
        "helm install kuberay-operator kuberay/kuberay-operator",
        "helm install tsp helm/tailspec",
        "kubectl get rayjob tsp-tailspec",
        "kubectl port-forward",
        "deploy/grafana",
        "could not be built",
    ):
        assert needle in text, needle

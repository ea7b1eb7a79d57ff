"""The Helm chart (helm/tailspec): `helm lint` and `helm template` pass, and the rendered RayJob validates against
the KubeRay CRD's openAPIV3Schema (vendored in deploy/kuberay/crds), with GPUs on and off.

Validation is stricter than the API server's default: unknown fields are errors (like `kubectl
--validate=strict`), not silently pruned. The CRD's CEL rules (x-kubernetes-validations) are not evaluated.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "tailspec"
CRDS = REPO / "deploy" / "kuberay" / "crds"


def _helm() -> str | None:
    local = Path(sys.executable).parent / "helm"  # the helm-binary dev dependency installs it next to python
    return str(local) if local.is_file() else shutil.which("helm")


HELM = _helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm binary not found (install the helm-binary dev dependency: make setup)"
)


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("helm-home")
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def _run(env, *args: str) -> str:
    proc = subprocess.run([HELM, *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _template(env, *set_args: str, release: str = "demo") -> list[dict]:
    out = _run(env, "template", release, str(CHART), "--namespace", "rl", *set_args)
    return [d for d in yaml.safe_load_all(out) if d]


def _one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# ------------------------------------------------------------------------------------------- CRD schema
def _k8s_to_jsonschema(node):
    """OpenAPI v3 (structural, Kubernetes flavour) -> JSON Schema: int-or-string as anyOf, unknown fields
    rejected wherever the schema lists properties and does not preserve unknown fields."""
    if isinstance(node, list):
        return [_k8s_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _k8s_to_jsonschema(v) for k, v in node.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out and "type" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _crd_schema(filename: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large: libyaml is ~10x faster
    crd = yaml.load((CRDS / filename).read_text(), Loader=loader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _k8s_to_jsonschema(v1["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="module")
def rayjob_validator():
    if not CRDS.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {CRDS}")
    schema = _crd_schema("ray.io_rayjobs.yaml")
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def raycluster_spec_validator():
    schema = _crd_schema("ray.io_rayclusters.yaml")["properties"]["spec"]
    return jsonschema.Draft7Validator(schema)


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


# -------------------------------------------------------------------------------------------------- tests
def test_helm_lint(helm_env):
    out = _run(helm_env, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out
    _run(helm_env, "lint", "--strict", str(CHART), "--set", "worker.gpus=1", "--set", "job.steps=2")


def test_default_render(helm_env, rayjob_validator, raycluster_spec_validator):
    docs = _template(helm_env)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap"] * 5 + ["PodMonitor"] * 2 + ["RayJob"]

    job = _one(docs, "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    assert _errors(rayjob_validator, job) == []
    assert _errors(raycluster_spec_validator, job["spec"]["rayClusterSpec"]) == []

    spec = job["spec"]
    entry = spec["entrypoint"]
    assert entry.startswith("python -m services.pipeline.cli train --config /etc/tailspec/config.yaml")
    assert "--run-dir /tmp/runs/demo-tailspec" in entry and "ray.address=auto" in entry
    assert "trainer.steps=" not in entry  # no override by default: the run config decides
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["PYTHONUNBUFFERED"] == "1"
    assert (
        "PYTHONPATH" not in runtime_env["env_vars"]
    )  # would conflict with the driver's ray.init runtime_env

    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0" and cluster["authOptions"] == {"mode": "token"}
    head = cluster["headGroupSpec"]["template"]["spec"]
    (head_c,) = head["containers"]
    assert {"name": "run-config", "mountPath": "/etc/tailspec", "readOnly": True} in head_c["volumeMounts"]
    assert head["volumes"][0]["configMap"]["name"] == "demo-tailspec-config"
    assert {p["name"] for p in head_c["ports"]} >= {"metrics", "dashboard", "gcs-server"}
    (group,) = cluster["workerGroupSpecs"]
    (worker_c,) = group["template"]["spec"]["containers"]
    for limits in (worker_c["resources"]["limits"], worker_c["resources"]["requests"]):
        assert "nvidia.com/gpu" not in limits
    assert "nodeSelector" not in group["template"]["spec"]
    assert group["replicas"] == 2


def test_gpu_render(helm_env, rayjob_validator, raycluster_spec_validator):
    docs = _template(
        helm_env,
        "--set",
        "worker.gpus=2",
        "--set-json",
        'worker.nodeSelector={"nvidia.com/gpu.present": "true"}',
        "--set-json",
        'worker.tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]',
        "--set-json",
        'head.nodeSelector={"pool": "cpu"}',
        "--set",
        "worker.replicas=4,worker.minReplicas=4,worker.maxReplicas=4",
        "--set",
        "job.steps=3",
        "--set",
        "outputs.existingClaim=tailspec-runs",
        "--set",
        "auth.mode=disabled",
    )
    job = _one(docs, "RayJob")
    assert _errors(rayjob_validator, job) == []
    assert _errors(raycluster_spec_validator, job["spec"]["rayClusterSpec"]) == []
    assert job["spec"]["entrypoint"].endswith("trainer.steps=3")
    cluster = job["spec"]["rayClusterSpec"]
    assert "authOptions" not in cluster
    (group,) = cluster["workerGroupSpecs"]
    pod = group["template"]["spec"]
    (worker_c,) = pod["containers"]
    assert worker_c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert worker_c["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert worker_c["resources"]["limits"]["cpu"] == "4"  # the CPU/memory values are kept
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert group["replicas"] == 4
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"pool": "cpu"}
    assert "nvidia.com/gpu" not in head["containers"][0]["resources"]["limits"]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "tailspec-runs"}} in head["volumes"]


def test_schema_check_catches_mistakes(helm_env, rayjob_validator):
    """The strict schema is not vacuous: a typo'd field, a wrong type and a bad quantity are reported."""
    job = _one(_template(helm_env), "RayJob")
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2  # typo
    bad["spec"]["backoffLimit"] = "zero"
    res = bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "resources"
    ]
    res["limits"]["memory"] = "16 gigs"
    errors = " | ".join(_errors(rayjob_validator, bad))
    assert "replica" in errors and "backoffLimit" in errors and "memory" in errors


def test_run_config_configmap(helm_env):
    docs = _template(helm_env)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-tailspec-config"]
    shipped = yaml.safe_load((REPO / "configs" / "gsm8k_tiny.yaml").read_text())
    assert yaml.safe_load(cm["data"]["config.yaml"]) == shipped  # values.yaml embeds the default config
    from services.common.config import load_config

    mounted = Path(helm_env["HOME"]) / "config.yaml"
    mounted.write_text(cm["data"]["config.yaml"])
    assert load_config(mounted).trainer.steps == shipped["trainer"]["steps"]  # it loads on the schema


def test_set_file_config(helm_env, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("trainer:\n  steps: 1\n")
    docs = _template(helm_env, "--set-file", f"config={other}")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == {"trainer": {"steps": 1}}


def test_podmonitors(helm_env):
    docs = _template(helm_env, "--set-json", 'metrics.podMonitor.labels={"release": "kps"}')
    mons = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(mons) == {"demo-tailspec-ray-head", "demo-tailspec-ray-worker"}
    head, worker = mons["demo-tailspec-ray-head"], mons["demo-tailspec-ray-worker"]
    assert head["apiVersion"] == "monitoring.coreos.com/v1"
    assert head["metadata"]["labels"]["release"] == "kps"
    assert head["spec"]["selector"]["matchLabels"]["ray.io/node-type"] == "head"
    assert worker["spec"]["selector"]["matchLabels"]["ray.io/node-type"] == "worker"
    assert {e["port"] for e in head["spec"]["podMetricsEndpoints"]} == {
        "metrics",
        "as-metrics",
        "dash-metrics",
    }
    assert [e["port"] for e in worker["spec"]["podMetricsEndpoints"]] == ["metrics"]
    # every port a PodMonitor scrapes is a named container port of the pods it selects
    job = _one(docs, "RayJob")
    cluster = job["spec"]["rayClusterSpec"]
    head_ports = {p["name"] for p in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    worker_ports = {
        p["name"] for p in cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["ports"]
    }
    assert {e["port"] for e in head["spec"]["podMetricsEndpoints"]} <= head_ports
    assert {e["port"] for e in worker["spec"]["podMetricsEndpoints"]} <= worker_ports
    # and the pods carry the labels the PodMonitors select on (KubeRay adds ray.io/node-type itself)
    for mon, tmpl in (
        (head, cluster["headGroupSpec"]["template"]),
        (worker, cluster["workerGroupSpecs"][0]["template"]),
    ):
        want = {k: v for k, v in mon["spec"]["selector"]["matchLabels"].items() if k != "ray.io/node-type"}
        assert want.items() <= tmpl["metadata"]["labels"].items()

    off = _template(helm_env, "--set", "metrics.podMonitor.enabled=false,grafana.dashboards.enabled=false")
    assert sorted(d["kind"] for d in off) == ["ConfigMap", "RayJob"]


def test_dashboard_configmaps(helm_env):
    docs = _template(helm_env, "--set", "grafana.dashboards.namespace=monitoring")
    cms = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert len(files) == 4
    assert sorted(k for cm in cms for k in cm["data"]) == files
    for cm in cms:
        assert cm["metadata"]["namespace"] == "monitoring"
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((REPO / "deploy" / "grafana" / name).read_text())


def test_chart_dashboards_match_deploy_copies():
    chart = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    deploy = {p.name: p.read_text() for p in (REPO / "deploy" / "grafana").glob("*.json")}
    assert chart == deploy, "re-render both copies: python -m services.common.dashboards"

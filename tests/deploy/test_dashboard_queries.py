"""Every Grafana dashboard query returns data against a real Prometheus that scraped a short run.

A local ``prometheus`` (Debian's package: ``apt-get install -y prometheus``; the test is skipped where it is
missing) is started on a free loopback port with a generated config that scrapes the run's metrics endpoint
(``ray.use_ray=false``, ``metrics.port``) every second. After a 3-step run every expression of every dashboard
is sent to Prometheus' HTTP API, Grafana's variables replaced by a window that spans the whole run, and each
must return at least one series.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from services.common import dashboards as dash
from tests.deploy.ports import free_ports

PROMETHEUS = shutil.which("prometheus")
STEPS = 3
WINDOW = "10m"  # $__rate_interval, $__interval and $__range: wider than the run, so it covers every sample

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed: apt-get install -y prometheus"
)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _query(base: str, expr: str) -> dict:
    return _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def _wait(what: str, ok, timeout_s: float = 90.0) -> None:
    """Poll ``ok()`` until true; fail naming ``what`` after ``timeout_s`` (a bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def grafana_to_promql(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced (``$__rate_interval``, ``$__interval``,
    ``$__range``: ``WINDOW``); fails on any other variable, which this test would not know how to fill."""
    out = expr
    for var in ("$__rate_interval", "$__interval", "$__range"):
        out = out.replace(var, WINDOW)
    assert "$" not in out, f"unknown Grafana variable in {expr!r}"
    return out


@pytest.fixture
def prometheus(tmp_path):
    """(Prometheus base URL, the metrics port it scrapes): a Prometheus scraping 127.0.0.1:<port> every 1 s."""
    metrics_port, web_port = free_ports(("metrics", "web")).values()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: tailspec\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{web_port}"
    try:
        _wait(
            "prometheus to be ready",
            lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=5).status == 200,
        )
        yield base, metrics_port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_every_dashboard_query_returns_data(train_tiny, prometheus):
    base, metrics_port = prometheus
    train_tiny("eval.enabled=false", f"metrics.port={metrics_port}", steps=STEPS, max_new_tokens=24)
    # the endpoint outlives the run: wait until Prometheus has scraped the last step, then one scrape more, so
    # that every series (also one born in the last step) has two samples and rate() / increase() are defined
    last = lambda: _query(base, "max(tailspec_rl_step)")["data"]["result"]  # noqa: E731
    _wait(f"a scrape of step {STEPS}", lambda: last() and float(last()[0]["value"][1]) == STEPS)

    def scrapes() -> float:
        return float(_query(base, "count_over_time(tailspec_rl_step[10m])")["data"]["result"][0]["value"][1])

    seen = scrapes()
    _wait("one more scrape", lambda: scrapes() > seen)

    empty, failed = [], []
    for d in dash.all_dashboards():
        for expr in d.exprs():
            out = _query(base, grafana_to_promql(expr))
            if out.get("status") != "success":
                failed.append((d.uid, expr, out.get("error")))
            elif not out["data"]["result"]:
                empty.append((d.uid, expr))
    assert not failed, failed
    assert not empty, f"{len(empty)} dashboard queries returned no data: {empty}"

"""The chart's monitoring objects: the opt-in PrometheusRule (``promtool check rules`` on the rendered rule,
``promtool test rules`` with a few series in rules-test.yaml), the Grafana dashboard ConfigMap (every
expression parses and names a metric a running sidecar exports) and the ``helm test`` pod."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.test_chart import CHART, RELEASE, by_kind, render
from tests.conftest import ServerFactory
from tests.integration.test_metrics import promtool

HERE = Path(__file__).resolve().parent
MONITORING = {
    "mode": "standalone",
    "prometheusRule": {"enabled": True, "latencyP99Seconds": 0.25},
    "grafanaDashboard": {"enabled": True},
}
# Metrics other exporters provide (kube-state-metrics), named by the rules on purpose.
FOREIGN = {"kube_pod_container_resource_limits"}
_NAME = re.compile(r"\b((?:memlane|process|python|kube)_[a-zA-Z0-9_]+)\b")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info")


def _rule_groups() -> list[dict[str, Any]]:
    (rule,) = by_kind(render(MONITORING), "PrometheusRule")
    return list(rule["spec"]["groups"])


def _dashboard() -> dict[str, Any]:
    (cm,) = [
        d for d in by_kind(render(MONITORING), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    return dict(json.loads(cm["data"]["memlane.json"]))


def _dashboard_exprs() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> list[str]:
        out = []
        for p in panels:
            out += [t["expr"] for t in p.get("targets", [])]
            out += walk(p.get("panels", []))
        return out

    exprs = walk(_dashboard()["panels"])
    # Grafana's variables, as Grafana substitutes them before Prometheus sees the query.
    return [e.replace("$__rate_interval", "5m").replace("$namespace", ".*") for e in exprs]


def _check_rules(tool: str, groups: list[dict[str, Any]], folder: Path) -> subprocess.CompletedProcess[str]:
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, check=False)


def test_rules_are_opt_in() -> None:
    assert by_kind(render({"mode": "standalone"}), "PrometheusRule") == []
    assert not [d for d in by_kind(render({}), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    tool = promtool()
    groups = _rule_groups()
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert {
        "MemlaneHighErrorRatio",
        "MemlaneHighLatencyP99",
        "MemlaneSessionEndBacklogGrowing",
        "MemlaneSessionEndBacklogStuck",
        "MemlaneParkedJobs",
        "MemlaneSummarizerFailures",
        "MemlaneExtractorFailures",
        "MemlaneRedisUnavailable",
        "MemlaneMemoryNearLimit",
    } <= alerts
    out = _check_rules(tool, groups, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # Positive control: the same check rejects a broken expression.
    broken = [{"name": "x", "rules": [{"alert": "Broken", "expr": "sum by (a (rate(x[5m]))"}]}]
    assert _check_rules(tool, broken, tmp_path).returncode != 0


def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": _rule_groups()}, sort_keys=False))
    shutil.copy(HERE / "rules-test.yaml", tmp_path / "rules-test.yaml")
    out = subprocess.run(
        [tool, "test", "rules", "rules-test.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_configmap_ships_the_dashboard_file() -> None:
    assert _dashboard() == json.loads((CHART / "dashboards" / "memlane.json").read_text())


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    tool = promtool()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 20
    groups = [
        {
            "name": "dashboard",
            "rules": [{"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(exprs)],
        }
    ]
    out = _check_rules(tool, groups, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def exported(start_server: ServerFactory) -> set[str]:
    """Metric family names a running sidecar (LTM on, admin port on) exports, from its scrape."""
    sidecar = start_server(admin_listen="127.0.0.1:0")
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.sidecar.admin_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def _family(name: str, exported: set[str]) -> bool:
    if name in exported:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in exported for s in _SUFFIXES)


def test_dashboard_and_rules_name_only_exported_metrics(exported: set[str]) -> None:
    rule_exprs = [r["expr"] for g in _rule_groups() for r in g["rules"]]
    names = {n for e in [*_dashboard_exprs(), *rule_exprs] for n in _NAME.findall(e)} - FOREIGN
    assert "memlane_rpc_duration_seconds_bucket" in names
    missing = sorted(n for n in names if not _family(n, exported))
    assert missing == [], f"not exported by a running sidecar: {missing}"
    # Positive control: a misspelt name is caught.
    assert not _family("memlane_rpc_duration_secs_bucket", exported)


def test_helm_test_pod_checks_grpc_health_of_the_service() -> None:
    docs = render({"mode": "standalone"})
    (pod,) = [d for d in by_kind(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    (svc,) = by_kind(docs, "Service")
    (container,) = pod["spec"]["containers"]
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert container["args"][:3] == [
        "health",
        "--target",
        f"{svc['metadata']['name']}.agents.svc:{grpc_port}",
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container["securityContext"]["runAsNonRoot"] is True
    # The test pod must not be selected by the Service it checks.
    assert not set(svc["spec"]["selector"].items()) <= set(pod["metadata"]["labels"].items())
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert not [d for d in by_kind(render({}), "Pod")]  # sidecar mode: no Service to check

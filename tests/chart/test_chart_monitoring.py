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

from tests.chart.test_chart import CHART, RELEASE, ROOT, by_kind, render
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
    return [
        e.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$pod", ".*") for e in exprs
    ]


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
        "MemlanePartStalled",
        "MemlanePartRestarting",
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


def test_every_alert_links_its_runbook_section() -> None:
    """runbook_url = prometheusRule.runbookBaseUrl + #<alert, lowercased>, and docs/operations.md has a
    heading GitHub turns into exactly that anchor, with the alert's What / Impact / Look / Fix."""
    base = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
    assert base.endswith("/docs/operations.md")
    docs = (ROOT / "docs" / "operations.md").read_text()
    sections = dict(re.findall(r"(?ms)^### (\S+)\n(.*?)(?=^#{2,3} |\Z)", docs))
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-"): h for h in sections}
    alerts = [r for g in _rule_groups() for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 9
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        assert url == f"{base}#{rule['alert'].lower()}", url
        heading = anchors.get(url.split("#", 1)[1])
        assert heading == rule["alert"], f"docs/operations.md has no runbook section for {rule['alert']}"
        for part in ("**What:**", "**Impact:**", "**Look:**", "**Fix:**"):
            assert part in sections[heading], (heading, part)
    # Positive control: a base set in values moves every link.
    rule_values: dict[str, Any] = {"enabled": True, "runbookBaseUrl": "https://d.example/ops"}
    values = {**MONITORING, "prometheusRule": rule_values}
    (rule,) = by_kind(render(values), "PrometheusRule")
    urls = {
        r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r
    }
    assert urls and all(u.startswith("https://d.example/ops#memlane") for u in urls)


def test_the_dashboard_filters_by_pod_and_shows_the_backlog_per_worker() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "label_values(memlane_build_info" in variables["pod"]["definition"]
    assert variables["pod"]["multi"] and variables["pod"]["includeAll"]

    def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [q for p in items for q in [p, *panels(p.get("panels", []))]]

    by_title = {p.get("title"): p for p in panels(dashboard["panels"])}
    per_worker = [t["expr"] for t in by_title["Jobs held per worker"]["targets"]]
    assert any("memlane_session_end_queue_pending_by_worker" in e and "by (worker)" in e for e in per_worker)
    assert any("memlane_session_end_queue_depth" in e for e in per_worker)
    # Every per-pod series can be narrowed to a pod (the queue-wide gauges need not be).
    queue_wide = ("memlane_session_end_queue_pending_by_worker", "memlane_session_end_queue_depth")
    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            assert 'pod=~"$pod"' in t["expr"] or p["title"] == "Jobs held per worker", p["title"]
            if p["title"] == "Jobs held per worker":
                assert any(n in t["expr"] for n in queue_wide)
    # No two panels overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine

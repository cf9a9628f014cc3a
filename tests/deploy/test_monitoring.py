"""monitoring/: the alert rules and the Grafana dashboard use what our exporter really exports.

Every series named in a PromQL expression must be one `prometheus_names()` lists (or a recording
rule of the same file), every label a tag we set. With promtool (Debian package `prometheus`)
the rules and the dashboard's queries are also parsed, and the alerts are run against synthetic
series: a fault that recovers, one that repeats at the same step, a stalled run, a flaky rank.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_resilience._internal.supervisor.metrics import METRIC_SPECS, prometheus_names

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus-rules.yaml"
DASHBOARD = REPO / "monitoring" / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = ("promtool not installed "
               "(Debian: apt-get install -y --no-install-recommends prometheus)")
# Tags the rules use before the exporter sets them (see the rank rule in prometheus-rules.yaml).
PENDING_TAGS = {"rank"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$run": ".*"}

pytestmark = pytest.mark.timeout(60)


def metric_names(expr: str) -> set[str]:
    """Series names in a PromQL expression (not functions, keywords, labels, durations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    found = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if match.group() not in KEYWORDS and not text[match.end():].lstrip().startswith("("):
            found.add(match.group())
    return found


def label_names(expr: str) -> set[str]:
    grouped = re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
    matched = re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"", expr)
    return {n.strip() for g in grouped for n in g.split(",") if n.strip()} | set(matched)


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def exported() -> set[str]:
    return {name for names in prometheus_names().values() for name in names}


def allowed_labels() -> set[str]:
    return {"run", "le", *PENDING_TAGS, *(t for s in METRIC_SPECS for t in s.tag_keys)}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=50,
                          check=False, cwd=cwd)


def test_metric_name_extraction() -> None:
    expr = ('sum by (run, le) (rate(a_total{x="b{c}", y=~"[0-9]+"}[5m] offset 1h)) > 0.5 '
            "and on (run) histogram_quantile(0.9, b_bucket) unless c:rec * 1e3")
    assert metric_names(expr) == {"a_total", "b_bucket", "c:rec"}
    assert label_names(expr) == {"run", "le", "x", "y"}


def test_rules_are_well_formed() -> None:
    names = [r["alert"] for r in rules() if "alert" in r]
    assert len(names) == len(set(names)) and names, names
    for rule in rules():
        assert ("alert" in rule) != ("record" in rule), rule
        if "alert" in rule:
            assert rule["alert"].startswith("RayResilience"), rule["alert"]
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert {"summary", "description"} <= rule["annotations"].keys()
            for text in rule["annotations"].values():  # the promtool test renders only these
                assert re.sub(r"\{\{ \$labels\.\w+ \}\}", "", text).count("{{") == 0, text
        else:
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_rules_use_only_exported_series_and_tags() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    used: set[str] = set()
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names <= exported() | recorded, (rule.get("alert") or rule["record"],
                                                sorted(names - exported() - recorded))
        assert label_names(rule["expr"]) <= allowed_labels(), rule["expr"]
        used |= names
    assert recorded <= used, f"recording rules nothing uses: {sorted(recorded - used)}"
    families = {"ray_ray_resilience_restarts_total", "ray_ray_resilience_completed_step",
                "ray_ray_resilience_checkpoint_age_s", "ray_ray_resilience_training_goodput",
                "ray_ray_resilience_recovery_time_s_bucket"}
    assert families <= used, sorted(families - used)


def test_dashboard_is_grafana_shaped() -> None:
    dash = dashboard()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36 and dash["uid"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variables["run"]["definition"])
    assert source and source.group(1) in exported() and source.group(2) == "run", source
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), ids
    boxes = []
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat", "bargauge", "table", "gauge"}, panel["type"]
        assert panel["title"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        boxes.append((pos["x"], pos["y"], pos["x"] + pos["w"], pos["y"] + pos["h"]))
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${datasource}"
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= variables.keys() | {"__rate_interval", "__range", "__interval"}, used
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)


def test_dashboard_shows_what_the_issue_asks_with_exported_series() -> None:
    used: set[str] = set()
    for expr in dashboard_exprs():
        names = metric_names(expr)
        assert names <= exported(), sorted(names - exported())
        assert label_names(expr) <= allowed_labels(), expr
        used |= names
    wanted = {"completed_step", "rollback_steps_sum", "checkpoint_age_s", "restarts_total",
              "recovery_time_s_bucket", "training_goodput"}
    assert {f"ray_ray_resilience_{w}" for w in wanted} <= used
    assert any("by (cause" in e and "restarts_total" in e for e in dashboard_exprs())


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_rules_and_dashboard_queries(tmp_path: Path) -> None:
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr
    queries = []
    for i, expr in enumerate(dashboard_exprs()):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        queries.append({"record": f"dashboard:query:n{i}", "expr": expr})
    rules = {"groups": [{"name": "d", "rules": queries}]}
    (tmp_path / "dash.yaml").write_text(yaml.safe_dump(rules))
    run = promtool("check", "rules", str(tmp_path / "dash.yaml"))
    assert run.returncode == 0, run.stdout + run.stderr


STEP, RESTARTS = "ray_ray_resilience_completed_step", "ray_ray_resilience_restarts_total"
SERIES = {  # one sample a minute from t=0; "_xN": N missing, "a+bxN": N+1 values
    # Fails at step 400 (t=40), resumes at 380, passes 400 at t=43 and trains on.
    f'{STEP}{{run="recovers"}}': "0+10x40 380+10x55",
    f'{RESTARTS}{{run="recovers",cause="exception",mechanism="inprocess"}}': "_x41 1x55",
    # From t=30 fails at step 300 every 11 minutes, rolled back to 250 each time.
    f'{STEP}{{run="repeats"}}': "0+10x30 " + " ".join(["250+5x10"] * 6),
    f'{RESTARTS}{{run="repeats",cause="exception",mechanism="inprocess"}}':
        "_x31 " + " ".join(f"{n}x10" for n in range(1, 7)),
    # Same, but every recovery sits 4 minutes at the failure point first (a slow respawn).
    f'{STEP}{{run="slowloop"}}': "0+10x30 " + " ".join(["250+10x5 300x3"] * 6),
    f'{RESTARTS}{{run="slowloop",cause="node_lost",mechanism="respawn"}}':
        "_x31 " + " ".join(f"{n}x9" for n in range(1, 7)),
    f'{STEP}{{run="stuck"}}': "100x96",
    f'{RESTARTS}{{run="flaky",cause="worker_died",mechanism="respawn",rank="3"}}': "_x10 1x20 2x65",
}
EXPECTED = {  # (minute, alert) -> labels of each firing alert; every other alert fires nowhere
    (42, "RayResilienceFaultRecovered"): [],
    (49, "RayResilienceFaultRecovered"): [{"run": "recovers"}],  # slowloop sits at its peak
    (75, "RayResilienceFaultRecovered"): [],
    (50, "RayResilienceRestartsWithoutProgress"): [],
    (75, "RayResilienceRestartsWithoutProgress"): [{"run": "repeats"}, {"run": "slowloop"}],
    (75, "RayResilienceSameCauseRepeating"): [{"run": "repeats", "cause": "exception"},
                                              {"run": "slowloop", "cause": "node_lost"}],
    (75, "RayResilienceCrashLoop"): [],
    (50, "RayResilienceRankFailsRepeatedly"): [{"run": "flaky", "rank": "3"}],
    (50, "RayResilienceTrainingStalled"): [{"run": "stuck"}],
    (75, "RayResilienceCheckpointStale"): [],
}


def rendered(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
                   for k, v in rule["annotations"].items()}
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_alerts_tell_a_recovered_fault_from_a_repeating_one(tmp_path: Path) -> None:
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    cases = [{"eval_time": f"{minute}m", "alertname": name,
              "exp_alerts": [rendered(alerts[name], labels) for labels in firing]}
             for (minute, name), firing in sorted(EXPECTED.items())]
    spec = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "alert_rule_test": cases,
                       "input_series": [{"series": s, "values": v} for s, v in SERIES.items()]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr

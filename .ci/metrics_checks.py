"""Checks of the monitoring files promtool does not make (run by .ci/metrics).

- Every alert of config/fencegate-alerts.yml has a test in
  config/fencegate-alerts.test.yml in which it fires.
- The Grafana dashboard is valid JSON, has `job` and `instance` query
  variables, and every panel expression is filtered by both and keeps `job`
  in every aggregation, so two clusters are never summed together.
"""

import json
import re
import sys

import yaml


def alerts_fire_in_tests(rules_path, tests_path):
    rules = yaml.safe_load(open(rules_path))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(open(tests_path))
    firing = {
        t["alertname"]
        for test in tests["tests"]
        for t in test.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    missing = sorted(alerts - firing)
    unknown = sorted(firing - alerts)
    problems = [f"alert {a} has no test in which it fires" for a in missing]
    problems += [f"the tests expect {a}, which is no alert" for a in unknown]
    return problems, f"{len(alerts)} alerts, each fires in a test"


AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\b\s*(?:by\s*\(([^)]*)\))?\s*\(")


def dashboard(path):
    d = json.load(open(path))
    problems = []
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name in ("job", "instance"):
        v = variables.get(name)
        if v is None or v.get("type") != "query" or "label_values(" not in v.get("definition", ""):
            problems.append(f"no `{name}` query variable on label_values")
    exprs = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    for title, expr in exprs:
        # Every selector of the expression, not just one of them.
        for name, labels in re.findall(r"\b((?:fencegate|process)_[a-z_]+|up)\b(\{[^}]*\})?", expr):
            for needle in ('job=~"$job"', 'instance=~"$instance"'):
                if needle not in labels:
                    problems.append(f"panel {title!r}: {name}{labels} lacks {needle}")
        for op, by in AGGREGATION.findall(expr):
            if "job" not in [g.strip() for g in by.split(",")]:
                problems.append(f"panel {title!r}: {op}() without `by (job, …)` sums clusters together")
    return problems, f"{len(exprs)} dashboard expressions filtered by $job and $instance"


def main():
    problems = []
    for found, said in (
        alerts_fire_in_tests("config/fencegate-alerts.yml", "config/fencegate-alerts.test.yml"),
        dashboard("config/grafana-dashboard.json"),
    ):
        problems += found
        if not found:
            print(said)
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

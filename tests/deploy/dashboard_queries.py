"""The PromQL queries of deploy/grafana/moecache-dashboard.json, with
Grafana's variables resolved, for the checks that run them (the idle check
under promtool, the live check against a real Prometheus)."""
import json


class DashboardError(Exception):
    pass


def dashboard_queries(path, rate_interval):
    """[(name 'panel / refId', expr)] and the template variables.

    $__rate_interval becomes `rate_interval`, $model matches every model."""
    dash = json.load(open(path))
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            expr = expr.replace("$__rate_interval", rate_interval)
            expr = expr.replace("${model}", ".*").replace("$model", ".*")
            if "$" in expr.replace("{{", ""):
                raise DashboardError(f"panel '{panel['title']}': unresolved variable in {expr}")
            out.append((f"{panel['title']} / {target['refId']}", expr))
    if not out:
        raise DashboardError(f"{path}: no queries")
    variables = list(dash.get("templating", {}).get("list", []))
    return out, variables

#!/usr/bin/python3
"""No dashboard query yields NaN on an idle daemon and worker.

Writes a promtool unit test in a temp dir: every metric the dashboard
(deploy/grafana/moecache-dashboard.json) reads exists with the labels the
services give it but never moves (counters flat, histograms without
observations: a freshly started daemon and worker with no requests, no
misses, no prefetches). Each query Q is evaluated as `(Q) != (Q)`, which
keeps exactly the NaN samples, and must return nothing. A query that divides
by a zero rate or takes a quantile of an empty histogram fails here; one
guarded with `> 0` (or `and on (...) count > 0`) returns no sample, which
Grafana shows as the panel's noValue text. The recording rules' idle case is
in rules_test.yml.

usage: dashboard_idle_check.py SOURCE_DIR
Exit 0 when no query yields NaN, 1 otherwise (promtool's report printed).
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

from dashboard_queries import DashboardError, dashboard_queries

# Labels as moe-cached and moe-worker export them (job/instance added by
# the scrape). Extra labels on a series are harmless to every query.
LABELS = {
    "moe_cache": 'job="moe-cached",instance="d:9464",model="idle",layer="0"',
    "moe_eamc": 'job="moe-cached",instance="d:9464",model="idle"',
    "moe_worker": 'job="moe-worker",instance="w:9465",status="ok"',
}


def idle_series(exprs):
    names = sorted({m for e in exprs for m in re.findall(r"\b(moe_\w+)", e)})
    series = [{"series": 'up{job="moe-cached",instance="d:9464"}', "values": "1x20"},
              {"series": 'up{job="moe-worker",instance="w:9465"}', "values": "1x20"}]
    for name in names:
        labels = next(v for k, v in LABELS.items() if name.startswith(k))
        if name.endswith("_bucket"):
            for le in ("0.001", "+Inf"):
                series.append({"series": f'{name}{{{labels},le="{le}"}}', "values": "0x20"})
        else:
            series.append({"series": f"{name}{{{labels}}}", "values": "0x20"})
    return series


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = sys.argv[1]
    try:
        queries, _ = dashboard_queries(
            os.path.join(src, "deploy/grafana/moecache-dashboard.json"), "1m")
    except DashboardError as e:
        print(f"FAIL: {e}")
        return 1
    test = {
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": idle_series([e for _, e in queries]),
            "promql_expr_test": [{"expr": f"({e}) != ({e})", "eval_time": "15m",
                                  "exp_samples": []} for _, e in queries],
        }],
    }
    with tempfile.TemporaryDirectory(prefix="moe-dashboard-idle-") as tmp:
        path = os.path.join(tmp, "dashboard_idle_test.yml")
        with open(path, "w") as f:
            yaml.safe_dump(test, f, sort_keys=False)
        r = subprocess.run(["promtool", "test", "rules", path], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: dashboard queries yield NaN on an idle daemon:\n{r.stdout}{r.stderr}")
        return 1
    print(f"{len(queries)} dashboard queries: no NaN on an idle daemon")
    return 0


if __name__ == "__main__":
    sys.exit(main())

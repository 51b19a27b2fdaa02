#!/usr/bin/python3
"""Every PromQL query of the deploy/ files against a real Prometheus.

Starts, in a temp dir: a small model (moectl make-model, experts large
enough for prefetches to pay), moe-cached with a small cache and prefetch
on, moe-worker attached to it with pre-gating hints (both report readiness
with sd_notify READY=1 to a NOTIFY_SOCKET of ours, as under systemd), and
Prometheus with deploy/prometheus/prometheus.yml and rules.yml (targets
rewritten to the services' ports, intervals to 1 s). Then checks that:
  - idle (before any request, once rates are defined): no dashboard query
    or recording rule yields NaN; ratios and quantiles are empty;
  - under a load loop of `moectl generate` through the worker, until a
    deadline: both scrape jobs are up; every query of
    deploy/grafana/moecache-dashboard.json parses and returns at least one
    finite sample ($__rate_interval -> 15s, $model -> .*), and never NaN;
    the template variable's label_values() finds the model; every recording
    rule of rules.yml returns a finite sample and every rule evaluates
    without error.
Everything started is killed at the end, also on failure.

usage: live_dashboard_check.py SOURCE_DIR BIN_DIR
Exit 0 on success, 1 on failure (with what failed, including a missing
prometheus).
"""
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

from dashboard_queries import DashboardError, dashboard_queries

# Whole check, start to finish. Measured on a loaded 2-core machine (load
# average 6-14): 10.4-12.4 s plain, 14.2-17.6 s under ASan beside a busy loop
# per core. Only a failing run waits this long.
DEADLINE_S = 45
STARTUP_S = 20        # one service until READY=1
RATE_INTERVAL = "15s"


class Failure(Exception):
    pass


def log(msg):
    print(f"[live] {msg}", flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Children started by this check; all stopped by stop_all()."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []  # (name, Popen, log path)

    def start(self, name, argv, env=None):
        path = os.path.join(self.tmp, f"{name}.log")
        out = open(path, "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        out.close()
        self.procs.append((name, p, path))
        return p

    def check_alive(self):
        for name, p, path in self.procs:
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode}:\n{tail(path)}")

    def stop_all(self):
        for _, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for name, p, _ in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{name} ignored SIGTERM; SIGKILL")
                p.kill()
                p.wait()


def tail(path, n=20):
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def start_notified(procs, name, argv):
    """Starts argv with NOTIFY_SOCKET and waits for READY=1."""
    sock_path = os.path.join(procs.tmp, f"{name}.notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path)
    p = procs.start(name, argv, env)
    end = time.monotonic() + STARTUP_S
    try:
        while time.monotonic() < end:
            sock.settimeout(0.2)
            try:
                msg = sock.recv(4096).decode(errors="replace")
            except socket.timeout:
                if p.poll() is not None:
                    raise Failure(f"{name} exited with {p.returncode} before READY=1:\n"
                                  f"{tail(os.path.join(procs.tmp, name + '.log'))}")
                continue
            if "READY=1" in msg.split("\n"):
                log(f"{name} sent READY=1")
                return p
        raise Failure(f"{name}: no READY=1 within {STARTUP_S}s:\n"
                      f"{tail(os.path.join(procs.tmp, name + '.log'))}")
    finally:
        sock.close()


def metrics_port_from_log(path):
    m = re.search(r"metrics on port (\d+)", open(path, errors="replace").read())
    if not m:
        raise Failure(f"no 'metrics on port N' line in {path}:\n{tail(path)}")
    return int(m.group(1))


def http_json(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # 400 carries Prometheus' error JSON
        try:
            return json.load(e)
        except ValueError:
            return {"status": "error", "error": f"HTTP {e.code}"}


def query(port, expr):
    url = (f"http://127.0.0.1:{port}/api/v1/query?"
           + urllib.parse.urlencode({"query": expr}))
    return http_json(url)


def all_values(result):
    """Sample values of an instant-query answer (vector or scalar)."""
    data = result.get("data", {})
    if data.get("resultType") == "vector":
        return [float(s["value"][1]) for s in data.get("result", [])]
    if data.get("resultType") == "scalar":
        return [float(data["result"][1])]
    return []


def finite_values(result):
    return [v for v in all_values(result) if math.isfinite(v)]


def rule_names(path):
    rules = yaml.safe_load(open(path))
    recorded = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    if not recorded or not alerts:
        raise Failure(f"{path}: expected recording and alerting rules")
    return recorded, alerts


def write_prometheus_config(src_dir, tmp, cached_port, worker_port):
    cfg = yaml.safe_load(open(os.path.join(src_dir, "deploy/prometheus/prometheus.yml")))
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    ports = {"moe-cached": cached_port, "moe-worker": worker_port}
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    if set(jobs) != set(ports):
        raise Failure(f"prometheus.yml: jobs {sorted(jobs)}, want {sorted(ports)}")
    for name, job in jobs.items():
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[name]}"]}]
    for rule_file in cfg.get("rule_files", []):
        shutil.copy(os.path.join(src_dir, "deploy/prometheus", rule_file),
                    os.path.join(tmp, rule_file))
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


class Load(threading.Thread):
    """Runs `moectl generate` through the worker until stopped."""

    def __init__(self, moectl, target):
        super().__init__(daemon=True)
        self.argv = [moectl, "generate", "--target", target, "--max-new-tokens", "12",
                     "--ignore-eos", "--timeout-s", "10"]
        self.stop = threading.Event()
        self.ok = 0
        self.errors = []

    def run(self):
        i = 0
        while not self.stop.is_set():
            # Prompts vary so that routing (and the cache) sees some churn.
            ids = ",".join(str(1 + (i * 7 + k * 13) % 200) for k in range(3 + i % 5))
            r = subprocess.run(self.argv + ["--prompt-ids", ids], capture_output=True,
                               timeout=20)
            if r.returncode == 0:
                self.ok += 1
            else:
                self.errors.append(r.stderr.decode(errors="replace")[-500:])
                if len(self.errors) > 3:
                    return
            i += 1


def check(src_dir, bin_dir, tmp, procs, start):
    moectl = os.path.join(bin_dir, "moectl")
    model = os.path.join(tmp, "tiny")
    # Experts of 768 KiB (the preset's are 48 KiB): the daemon's copy chunk
    # is then expert / 16 - 64 KiB - and the prefetch gate's chunk charge
    # C = chunk / link is X / 12 instead of X, so prefetches can pay
    # (services/cache/prefetcher.h). With the link fast enough that X stays
    # below the layer compute time T, however slow a sanitized or loaded run,
    # the gate depends on the candidates' calibrated probability only, not on
    # timing: p > (1 - p) * value(victim) + 1/12. The worker's pre-gating
    # hints add candidates of measured precision.
    r = subprocess.run([moectl, "make-model", "--preset", "tiny", "--arch", "mixtral",
                        "--intermediate", "2048", "--out", model],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise Failure(f"make-model failed: {r.stderr.decode(errors='replace')}")

    cached_sock = os.path.join(tmp, "moe-cached.sock")
    start_notified(procs, "moe-cached", [
        os.path.join(bin_dir, "moe-cached"), f"--model=tiny={model}",
        f"--listen=unix:{cached_sock}", "--metrics-addr=127.0.0.1:0",
        "--cache-experts=12", "--policy=moe-infinity", "--prefetch=on", "--link-gbps=1000",
        f"--state-dir={tmp}/state"])
    cached_metrics = metrics_port_from_log(os.path.join(tmp, "moe-cached.log"))

    worker_sock = os.path.join(tmp, "moe-worker.sock")
    port_file = os.path.join(tmp, "worker.ports")
    start_notified(procs, "moe-worker", [
        os.path.join(bin_dir, "moe-worker"), f"--model={model}",
        f"--cache=unix:{cached_sock}", "--cache-model=tiny", "--backend=cpu",
        f"--listen=unix:{worker_sock}", "--metrics-addr=127.0.0.1:0",
        "--pregate-hints=on", "--max-batch=4", "--prefill-chunk=4",
        f"--port-file={port_file}"])  # batched: the batching panel has data
    worker_metrics = json.load(open(port_file))["metrics_port"]
    log(f"metrics: moe-cached :{cached_metrics}, moe-worker :{worker_metrics}")

    prom_port = free_port()
    config = write_prometheus_config(src_dir, tmp, cached_metrics, worker_metrics)
    procs.start("prometheus", [
        "prometheus", f"--config.file={config}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        f"--storage.tsdb.path={tmp}/tsdb", "--log.level=warn"])
    wait_ready(procs, prom_port, start)
    checks, variables, alerts = all_checks(src_dir)
    verify_idle(procs, prom_port, checks, start)

    load = Load(moectl, f"unix:{worker_sock}")
    load.start()
    try:
        verify_queries(procs, prom_port, checks, load, start)
        verify_rules_and_variables(prom_port, variables, checks, alerts)
    finally:
        load.stop.set()
        load.join(timeout=25)
    log(f"load: {load.ok} generate calls succeeded")


def wait_ready(procs, port, start):
    while time.monotonic() - start < DEADLINE_S:
        procs.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                if r.status == 200:
                    log(f"prometheus ready on :{port}")
                    return
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            pass
        time.sleep(0.1)  # polling an external server's readiness
    raise Failure("prometheus not ready in time")


def all_checks(src_dir):
    """[(name, expr)] for both jobs' up, every dashboard query and every
    recording rule; the template variables; the alert names."""
    queries, variables = dashboard_queries(
        os.path.join(src_dir, "deploy/grafana/moecache-dashboard.json"), RATE_INTERVAL)
    recorded, alerts = rule_names(os.path.join(src_dir, "deploy/prometheus/rules.yml"))
    checks = [(f"up {job}", f'up{{job="{job}"}} == 1') for job in ("moe-cached", "moe-worker")]
    checks += queries + [(f"recording rule {r}", r) for r in recorded]
    return checks, variables, alerts


def samples(name, expr, res):
    """Sample values of an instant-query answer; a parse error or a NaN
    fails at once (neither heals by waiting: every ratio and quantile of
    deploy/ guards its denominator, so NaN means a query lost its guard)."""
    if res.get("status") != "success":
        raise Failure(f"{name}: query failed: {res.get('error')}\n  {expr}")
    values = all_values(res)
    if any(math.isnan(v) for v in values):
        raise Failure(f"{name}: NaN sample (an unguarded 0/0?): "
                      f"{json.dumps(res.get('data'))[:300]}\n  {expr}")
    return values


def verify_idle(procs, port, checks, start):
    """Before the first request: every query answers, and none with NaN.

    Waits (on Prometheus, not a fixed time) until rates are defined: three
    scrapes of each job in the last 10 s and a recording rule evaluated over
    them. Ratios and quantiles are then empty (nothing to divide), plain
    rates 0."""
    ready = ('min(count_over_time(up[10s])) >= 3 '
             'and on () count(moecache:stall_ratio:rate5m) > 0')
    while not finite_values(query(port, ready)):
        procs.check_alive()
        if time.monotonic() - start > DEADLINE_S:
            raise Failure(f"idle: no rule evaluation over three scrapes within {DEADLINE_S}s")
        time.sleep(0.2)  # the next scrape / rule evaluation (1 s intervals)
    empty = [name for name, expr in checks if not samples(name, expr, query(port, expr))]
    log(f"idle: no NaN in {len(checks)} queries; {len(empty)} correctly empty: "
        + ", ".join(empty))


def verify_queries(procs, port, checks, load, start):
    """Under load, until the deadline: every check returns a finite sample."""
    pending = dict(checks)
    last = {}
    while pending and time.monotonic() - start < DEADLINE_S:
        procs.check_alive()
        if load.errors and len(load.errors) > 3:
            raise Failure("moectl generate keeps failing:\n" + "\n".join(load.errors))
        for name, expr in list(pending.items()):
            res = query(port, expr)
            last[name] = res
            samples(name, expr, res)
            if finite_values(res):
                del pending[name]
        if pending:
            time.sleep(0.5)  # waiting for the next scrapes / rule evaluations
    if pending:
        lines = [f"  {n}: {json.dumps(last.get(n, {}).get('data'))[:300]}\n    {e}"
                 for n, e in pending.items()]
        raise Failure(f"{len(pending)} of {len(checks)} queries returned no finite "
                      f"sample within {DEADLINE_S}s ({load.ok} generate calls done):\n"
                      + "\n".join(lines))
    log(f"all {len(checks)} queries returned data after "
        f"{time.monotonic() - start:.1f}s ({load.ok} generate calls done)")


def verify_rules_and_variables(port, variables, checks, alerts):
    recorded = [n[len("recording rule "):] for n, _ in checks
                if n.startswith("recording rule ")]
    for var in variables:
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q)
        if not m:
            raise Failure(f"template variable {var['name']}: unsupported query {q}")
        url = (f"http://127.0.0.1:{port}/api/v1/label/{m.group(2)}/values?"
               + urllib.parse.urlencode({"match[]": m.group(1)}))
        values = http_json(url).get("data", [])
        if "tiny" not in values:
            raise Failure(f"template variable {var['name']}: {q} gave {values}")

    rules = http_json(f"http://127.0.0.1:{port}/api/v1/rules")
    seen = set()
    for group in rules["data"]["groups"]:
        for rule in group["rules"]:
            seen.add(rule["name"])
            if rule.get("health") not in ("ok", "unknown") or rule.get("lastError"):
                raise Failure(f"rule {rule['name']}: {rule.get('health')} "
                              f"{rule.get('lastError')}")
    missing = set(recorded + alerts) - seen
    if missing:
        raise Failure(f"rules not loaded by prometheus: {sorted(missing)}")
    firing = [a["labels"]["alertname"] for a in
              http_json(f"http://127.0.0.1:{port}/api/v1/alerts")["data"]["alerts"]
              if a["labels"]["alertname"] in ("MoecacheDaemonDown", "MoeWorkerDown")]
    if firing:
        raise Failure(f"down alerts pending/firing while both services are up: {firing}")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src_dir, bin_dir = sys.argv[1], sys.argv[2]
    if shutil.which("prometheus") is None:
        print("FAIL: prometheus is not installed (apt-get install --no-install-recommends "
              "prometheus)")
        return 1
    for b in ("moe-cached", "moe-worker", "moectl"):
        if not os.access(os.path.join(bin_dir, b), os.X_OK):
            print(f"FAIL: {bin_dir}/{b} is not built (build targets moe-cached moe-worker "
                  "moectl first)")
            return 1
    # ctest's timeout (or ^C) must still run the cleanup below.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(f"FAIL: got signal {signum}"))
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="moe-deploy-live-")
    procs = Processes(tmp)
    try:
        check(src_dir, bin_dir, tmp, procs, start)
    except (Failure, DashboardError) as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"PASS in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

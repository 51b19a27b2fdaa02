#!/bin/bash
# Static checks of deploy/: the systemd units (systemd-analyze verify, with
# ExecStart pointed at the built binaries), the sysusers.d file (applied to a
# temp root), the units' ExecStart expanded with the example environment
# file (unit_exec_check.py), and the Prometheus config and rules (promtool
# check config / check rules / test rules with rules_test.yml, and every
# dashboard query on an idle daemon with dashboard_idle_check.py).
#
# usage: check_deploy.sh SOURCE_DIR BIN_DIR
# Exit 0 on success, 1 on failure (a missing systemd-analyze or promtool
# included).
set -u
SRC=$1
BIN=$2
PY=/usr/bin/python3

for tool in systemd-analyze systemd-sysusers promtool; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: $tool is not installed (scripts/setup-deps.sh installs it)"
    exit 1
  fi
done
for b in moe-cached moe-worker moectl; do
  if [[ ! -x $BIN/$b ]]; then
    echo "FAIL: $BIN/$b is not built (build moe-cached moe-worker moectl first)"
    exit 1
  fi
done

TMP=$(mktemp -d /tmp/moe-deploy-static.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok   $*"; }

# 1. systemd-analyze verify. It checks that ExecStart= is executable, so the
# copies point /usr/local/bin at the build. It exits 0 on mere warnings
# (unknown keys, bad values are "ignored"), so any output is a failure.
mkdir -p "$TMP/units"
for unit in moe-cached.service moe-worker.service; do
  sed "s#/usr/local/bin/#$BIN/#g" "$SRC/deploy/systemd/$unit" > "$TMP/units/$unit"
  if ! grep -q "^ExecStart=$BIN/" "$TMP/units/$unit"; then
    fail "$unit: ExecStart is not under /usr/local/bin"
  fi
done
if out=$(cd "$TMP/units" && systemd-analyze verify --man=no ./moe-cached.service ./moe-worker.service 2>&1) \
    && [[ -z $out ]]; then
  pass "systemd-analyze verify moe-cached.service moe-worker.service"
else
  fail "systemd-analyze verify:"$'\n'"$out"
fi
for unit in moe-cached.service moe-worker.service; do
  for key in Type=notify Restart=on-failure LimitMEMLOCK=infinity User=moecache \
             RuntimeDirectory=moecache RuntimeDirectoryPreserve=yes NoNewPrivileges=yes \
             ProtectSystem=strict PrivateTmp=yes EnvironmentFile=/etc/moecache/moecache.env \
             "RestartPreventExitStatus=2 78"; do
    grep -qx "$key" "$SRC/deploy/systemd/$unit" || fail "$unit lacks $key"
  done
  # Both services take their --device from one variable, so they agree
  # (issue 28: a worker on CUDA against a host arena is a restart loop).
  grep -qx '    --device=${MOECACHE_DEVICE} \\' "$SRC/deploy/systemd/$unit" \
    || fail "$unit does not pass --device=\${MOECACHE_DEVICE}"
done
grep -qx "StateDirectory=moecache" "$SRC/deploy/systemd/moe-cached.service" \
  || fail "moe-cached.service lacks StateDirectory=moecache"
for key in Wants=moe-cached.service "After=moe-cached.service network.target"; do
  grep -qx "$key" "$SRC/deploy/systemd/moe-worker.service" || fail "moe-worker.service lacks $key"
done

# 2. sysusers.d: creates the user and group the units run as.
mkdir -p "$TMP/root/etc"
if out=$(systemd-sysusers --root="$TMP/root" "$SRC/deploy/systemd/moecache.conf" 2>&1) \
    && grep -q '^moecache:x:[0-9]*:[0-9]*:.*:/var/lib/moecache:' "$TMP/root/etc/passwd" \
    && grep -q '^moecache:x:' "$TMP/root/etc/group"; then
  pass "systemd-sysusers moecache.conf"
else
  fail "systemd-sysusers moecache.conf:"$'\n'"$out"
fi

# 2b. tmpfiles.d: sets shmem_enabled to advise (written into a fake /sys).
thp="$TMP/root/sys/kernel/mm/transparent_hugepage"
mkdir -p "$thp"
echo never >"$thp/shmem_enabled"
if out=$(systemd-tmpfiles --root="$TMP/root" --create \
      "$SRC/deploy/systemd/moecache-hugepages.conf" 2>&1) \
    && [ "$(cat "$thp/shmem_enabled")" = advise ]; then
  pass "systemd-tmpfiles moecache-hugepages.conf"
else
  fail "systemd-tmpfiles moecache-hugepages.conf (shmem_enabled: $(cat "$thp/shmem_enabled")):"$'\n'"$out"
fi

# 3. The ExecStart lines with the example environment file.
if out=$("$PY" "$SRC/tests/deploy/unit_exec_check.py" "$SRC" "$BIN" 2>&1); then
  echo "$out"
else
  fail "unit_exec_check.py:"$'\n'"$out"
fi

# 4. Prometheus configuration and rules.
if out=$(promtool check config "$SRC/deploy/prometheus/prometheus.yml" 2>&1); then
  pass "promtool check config prometheus.yml"
else
  fail "promtool check config:"$'\n'"$out"
fi
if out=$(promtool check rules "$SRC/deploy/prometheus/rules.yml" 2>&1); then
  pass "promtool check rules rules.yml"
else
  fail "promtool check rules:"$'\n'"$out"
fi
if out=$(cd "$SRC/tests/deploy" && promtool test rules rules_test.yml 2>&1); then
  pass "promtool test rules rules_test.yml"
else
  fail "promtool test rules:"$'\n'"$out"
fi

if out=$("$PY" "$SRC/tests/deploy/dashboard_idle_check.py" "$SRC" 2>&1); then
  pass "dashboard_idle_check.py: $out"
else
  fail "dashboard_idle_check.py:"$'\n'"$out"
fi

# 5. The dashboard is JSON with queries in every panel.
if out=$("$PY" - "$SRC/deploy/grafana/moecache-dashboard.json" 2>&1 <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
for p in d["panels"]:
    assert p.get("targets"), f"panel {p['title']} has no queries"
    for t in p["targets"]:
        assert t.get("expr"), f"panel {p['title']}: empty query"
print(f"{len(d['panels'])} panels")
PYEOF
); then
  pass "dashboard JSON ($out)"
else
  fail "dashboard JSON:"$'\n'"$out"
fi

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all deploy checks passed"

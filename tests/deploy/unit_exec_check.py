#!/usr/bin/python3
"""The units' ExecStart lines, expanded as systemd would, are accepted.

For each unit: takes the [Service] Environment= defaults, then the example
environment file (deploy/moecache.env overrides them, as EnvironmentFile=
does), joins the ExecStart continuation lines, expands ${VAR} (one word)
and $VAR (split at spaces, gone when empty), points /usr/local/bin at
BIN_DIR and runs the command with --help appended: the binary parses every
flag before it looks at --help, so an unknown flag or a malformed value
fails. A variable the unit uses but nobody defines fails too.

usage: unit_exec_check.py SOURCE_DIR BIN_DIR
"""
import os
import re
import shlex
import subprocess
import sys

UNITS = ("moe-cached.service", "moe-worker.service")


def read_env_file(path):
    env = {}
    for n, line in enumerate(open(path), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if not m:
            raise ValueError(f"{path}:{n}: not KEY=value: {line}")
        env[m.group(1)] = m.group(2)
    return env


def service_section(path):
    """(Environment= pairs, ExecStart= text) of the [Service] section."""
    text = open(path).read().replace("\\\n", " ")
    section, env, exec_start = None, {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line.startswith("Environment="):
            key, _, value = line[len("Environment="):].partition("=")
            env[key] = value
        elif section == "[Service]" and line.startswith("ExecStart="):
            exec_start = line[len("ExecStart="):]
    if exec_start is None:
        raise ValueError(f"{path}: no ExecStart=")
    return env, exec_start


def expand(command, env, undefined):
    words = []
    for word in shlex.split(command):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:  # $VAR alone: split at whitespace, nothing when empty
            if m.group(1) not in env:
                undefined.add(m.group(1))
            words += env.get(m.group(1), "").split()
            continue

        def sub(m):
            if m.group(1) not in env:
                undefined.add(m.group(1))
            return env.get(m.group(1), "")
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word))
    return words


def main():
    src_dir, bin_dir = sys.argv[1], sys.argv[2]
    env_file = read_env_file(os.path.join(src_dir, "deploy/moecache.env"))
    failures = 0
    for unit in UNITS:
        defaults, exec_start = service_section(os.path.join(src_dir, "deploy/systemd", unit))
        env = dict(defaults)
        env.update(env_file)
        undefined = set()
        argv = expand(exec_start, env, undefined)
        if not argv[0].startswith("/usr/local/bin/"):
            print(f"FAIL {unit}: ExecStart {argv[0]} is not under /usr/local/bin")
            failures += 1
            continue
        argv[0] = os.path.join(bin_dir, os.path.basename(argv[0]))
        if undefined:
            print(f"FAIL {unit}: variables defined nowhere: {sorted(undefined)}")
            failures += 1
        r = subprocess.run(argv + ["--help"], capture_output=True, timeout=30)
        if r.returncode != 0:
            print(f"FAIL {unit}: {shlex.join(argv)} --help exited {r.returncode}:\n"
                  f"{r.stderr.decode(errors='replace')}")
            failures += 1
        else:
            print(f"ok   {unit}: {shlex.join(argv)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

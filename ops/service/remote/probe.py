"""Service facts, printed as one JSON object; reads only (``--check`` runs it for real).

argv[1]: JSON {name, pidfile, state, acceptance, log, env_file, proven, auth_env, supervisor,
health, metrics, venv, packages}. ``apikey.py`` is prepended: /health and /metrics carry the key of
``auth_env`` when it sets one.
"""

import glob
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request


def sha(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def process(pid):
    """pid, uptime and working directory of a live process; None for a dead one or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            up = float(fh.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    if fields[0] == "Z":
        return None
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    return {"pid": pid, "uptime_s": round(up - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 1), "cwd": cwd}


def get(url, limit, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=3) as r:
            return r.status, r.read(limit).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def supervised(pidfile):
    try:
        with open(pidfile) as fh:
            return process(int(fh.read().strip()))
    except (OSError, ValueError):
        return None


def systemd_facts(name):
    uid = os.getuid()
    home = os.path.expanduser("~")
    usable = bool(
        os.path.isdir("/run/systemd/system")
        and shutil.which("systemctl")
        and (uid == 0 or os.path.exists(f"/run/user/{uid}/bus"))
    )
    unit_dir = "/etc/systemd/system/" if uid == 0 else home + "/.config/systemd/user/"
    facts = {
        "usable": usable,
        "scope": "system" if uid == 0 else "user",
        "uid": uid,
        "unit_path": unit_dir + name + ".service",
        "process": None,
    }
    facts["unit_sha"] = sha(facts["unit_path"])
    if usable:
        ctl = ["systemctl"] if uid == 0 else ["systemctl", "--user"]
        env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{uid}"))
        out = subprocess.run(
            [*ctl, "show", "-p", "ActiveState,MainPID", name + ".service"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        pid = int(props.get("MainPID") or 0)
        facts["active"] = props.get("ActiveState")
        facts["process"] = process(pid) if pid > 0 and props.get("ActiveState") == "active" else None
    return facts


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def proven_env(folder):
    """release -> sha256 of each env file copy a proven start left (``<release>.env``)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    return {n[: -len(".env")]: sha(os.path.join(folder, n)) for n in names if n.endswith(".env")}


def pins(venv, packages):
    """Installed versions of ``packages`` (PEP 503 names) in the venv, read from its metadata
    (this python may not be the venv's: nothing is imported)."""
    paths = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    found = {}
    for dist in importlib.metadata.distributions(path=paths) if paths else ():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name in packages and name not in found:
            found[name] = dist.version
    return dict(sorted(found.items()))


def main(s):
    sup = supervised(s["pidfile"])
    systemd = systemd_facts(s["name"])
    facts = {
        "supervisor_process": sup,
        "systemd": systemd,
        "state": read_json(s["state"]),
        "acceptance": read_json(s["acceptance"]),
        "pins": pins(s["venv"], s["packages"]),
        "supervisor_status": read_json(s["pidfile"][:-4] + ".status"),
        "env_sha": sha(s["env_file"]),
        "proven_env": proven_env(s["proven"]) if s.get("proven") else {},
        "supervisor_sha": sha(s["supervisor"]),
        "health": None,
        "metrics": None,
        "log_size": os.path.getsize(s["log"]) if os.path.exists(s["log"]) else 0,
    }
    if sup or systemd["process"]:
        headers = auth_headers(s.get("auth_env"))  # noqa: F821 (from apikey.py)
        facts["health"], error = get(s["health"], 1 << 16, headers)
        if facts["health"] is None:
            facts["health_error"] = error
        if s["metrics"]:
            status, text = get(s["metrics"], 1 << 20, headers)
            facts["metrics"] = text if status == 200 else None
    print(json.dumps(facts))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

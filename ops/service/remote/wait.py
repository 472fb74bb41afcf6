"""Wait until the server answers: ready, a model id from /v1/models, one real completion.

Ready is ``ready_on``: ``health`` (our server: /health is 200 only once warmed) or ``models``
(vLLM, SGLang: /health is 200 while the engine still loads, so the port must accept and
/v1/models must list ``model``, the served id).

argv[1]: JSON {url, timeout, prompt, max_tokens, ready_on, model, pidfile | (systemctl, unit),
env_file?}. Prints one JSON
object, ``{"ready": true, "pid", "healthy_after", "text", "elapsed"}`` or ``{"ready": false,
"error", "elapsed"}``; the controller decides what a failure means (roll back, or report).
An answer counts only when the socket behind the port belongs to the process we started (or its
children): ``sockets.py`` is prepended to this script. With an API key in the server's env file
(``apikey.py``, prepended too) every request carries it.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

START = time.monotonic()


def current_pid(s):
    if s.get("pidfile"):
        try:
            with open(s["pidfile"]) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.getuid()}"))
    out = subprocess.run(
        s["systemctl"] + ["show", "-p", "MainPID", "--value", s["unit"]],
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    return int(out) if out.isdigit() and int(out) > 0 else None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError, TypeError):
        return False


HEADERS = {"Content-Type": "application/json"}


def fetch(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 16).decode("utf-8", "replace")
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def accepting(url):
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
        return True
    except OSError:
        return False


def done(ready, **extra):
    print(json.dumps(dict(extra, ready=ready, elapsed=round(time.monotonic() - START, 2))))
    sys.exit(0)


def complete(s, pid, healthy):
    """One completion once ready; returns (status, body) when it is not served yet."""
    status, body = fetch(s["url"] + "/v1/models")
    if status != 200:
        return status, body
    try:
        listed = [m["id"] for m in json.loads(body)["data"]]
        model = s.get("model") or listed[0]
    except (ValueError, KeyError, IndexError, TypeError):
        done(False, error=f"/v1/models answered without a model id: {body[:200]}")
    if model not in listed:
        return status, f"/v1/models lists {listed}, not {model!r} (yet)"
    request = {"model": model, "prompt": s["prompt"], "max_tokens": s["max_tokens"], "temperature": 0}
    status, body = fetch(s["url"] + "/v1/completions", request)
    if status == 200:
        try:
            text = json.loads(body)["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            done(False, error=f"/v1/completions answered without choices: {body[:200]}")
        done(True, pid=pid, healthy_after=healthy, text=text)
    if status not in (429, 503):
        done(False, error=f"/v1/completions answered {status}: {body[:300]}")
    return status, body


def main(s):
    HEADERS.update(auth_headers(s.get("env_file")))  # noqa: F821 (from apikey.py)
    first = current_pid(s)
    healthy = None
    while True:
        pid = current_pid(s)
        if pid is None or not alive(pid):
            done(False, error=f"the server process {pid or first or '?'} exited")
        if first is not None and pid != first:
            done(False, error=f"the server restarted (pid {first} -> {pid})")
        if s.get("ready_on") == "models":
            status, body = (200, "") if accepting(s["url"]) else (None, "the port does not accept yet")
        else:
            status, body = fetch(s["url"] + "/health")
        if status == 200:
            port = urllib.parse.urlsplit(s["url"]).port
            owner = port_owner(port, pid)  # noqa: F821 (from sockets.py)
            if owner:
                done(
                    False,
                    error=f"port {port} answers, but not from the server we started (pid {pid}): "
                    f"it is held by {owner} (fix: stop that process, or set serve.port)",
                )
            healthy = healthy or round(time.monotonic() - START, 2)
            status, body = complete(s, pid, healthy)
        if time.monotonic() - START > s["timeout"]:
            last = f"{status} {body[:200]}"
            done(False, error=f"no healthy answer within {s['timeout']}s (last: {last})")
        time.sleep(0.25)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

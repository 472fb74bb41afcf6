"""The acceptance probe: a short greedy run on held-out prompts, between two scrapes of /metrics.

argv[1]: JSON {url, model (or null: the first /v1/models lists), prompts, max_tokens, modes:
[{mode, extra}], keep (metric names to keep), timeout, env_file, key_names}. A server that wants an
API key gets it as a bearer token, read from the 0600 env file (the first of ``key_names`` set
there: never on a command line; ``apikey.py`` is prepended). For each mode: scrape, one greedy
completion per prompt (``extra`` joins the body: our server's ``mode``), scrape again. Prints one
JSON object {"modes": {MODE: {"before", "after", "requests", "tokens", "errors"}}} or {"error"};
``before``/``after`` hold only the kept metric lines (None when /metrics does not answer 200).
The controller reads tau from them (``ops/bench/spec_counters.py``) and judges.
"""

import json
import sys
import time
import urllib.error
import urllib.request

HEADERS = {"Content-Type": "application/json"}


def call(url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(1 << 22).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 14).decode("utf-8", "replace")
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def scrape(url, keep):
    status, text = call(url + "/metrics")
    if status != 200:
        return None
    lines = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.removesuffix("_total") in keep:
            lines.append(line)
    return "\n".join(lines) + "\n"


def model_id(url):
    status, body = call(url + "/v1/models")
    try:
        return json.loads(body)["data"][0]["id"] if status == 200 else None
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def main(s):
    key = api_key(s.get("env_file") or "", s.get("key_names") or [])  # noqa: F821 (from apikey.py)
    if key:
        HEADERS["Authorization"] = "Bearer " + key
    deadline = time.monotonic() + s["timeout"]
    model = s["model"] or model_id(s["url"])
    if model is None:
        print(json.dumps({"error": f"{s['url']}/v1/models lists no model"}))
        return
    out = {}
    for entry in s["modes"]:
        found = {"before": scrape(s["url"], s["keep"]), "requests": 0, "tokens": 0, "errors": []}
        for prompt in s["prompts"]:
            left = deadline - time.monotonic()
            if left <= 0:
                found["errors"].append(f"the probe ran out of its {s['timeout']}s")
                break
            body = {"model": model, "prompt": prompt, "max_tokens": s["max_tokens"], "temperature": 0}
            status, text = call(s["url"] + "/v1/completions", dict(body, **entry["extra"]), min(left, 600))
            try:
                usage = json.loads(text)["usage"] if status == 200 else None
            except (ValueError, KeyError, TypeError):
                usage = None
            if usage is None:
                found["errors"].append(f"/v1/completions answered {status}: {text[:200]}")
                continue
            found["requests"] += 1
            found["tokens"] += int(usage.get("completion_tokens") or 0)
        found["after"] = scrape(s["url"], s["keep"])
        out[entry["mode"]] = found
    print(json.dumps({"modes": out}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""The API key a server reads from its env file (ours ``SPECOPS_SERVE_API_KEY``, vLLM's
``VLLM_API_KEY``), for what talks to it on the host: the health wait, the probe of ``fab status``,
the acceptance probe, the benchmark client. The key stays in the 0600 file, never on a command
line. Standard library only: prepended to ``wait.py``, ``probe.py`` and ``accept.py``
(``ops/service/facts.py``), imported by ``ops.bench.client``.
"""

API_KEYS = ("SPECOPS_SERVE_API_KEY", "VLLM_API_KEY")


def api_key(env_file, names=API_KEYS):
    """The first of ``names`` set in ``env_file`` (KEY=VALUE lines, as the servers read them)."""
    if not env_file:
        return None
    try:
        with open(env_file) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :]
        name, sep, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if sep and value:
            found[name.strip()] = value
    return next((found[n] for n in names if n in found), None)


def auth_headers(env_file):
    """``{"Authorization": "Bearer <key>"}`` when the env file sets a key, else ``{}``."""
    key = api_key(env_file)
    return {"Authorization": f"Bearer {key}"} if key else {}

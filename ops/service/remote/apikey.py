"""The API key our server reads from its env file (``SPECOPS_SERVE_API_KEY``), for what talks to it
on the host: the health wait, the probe of ``fab status``, the benchmark client. The key stays in
the 0600 file, never on a command line. Standard library only: prepended to ``wait.py`` and
``probe.py`` (``ops/service/facts.py``), imported by ``ops.bench.client``.
"""

API_KEY = "SPECOPS_SERVE_API_KEY"


def api_key(env_file):
    """The key in ``env_file`` (KEY=VALUE lines, as the server reads them); None without one."""
    if not env_file:
        return None
    try:
        with open(env_file) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :]
        name, sep, value = line.partition("=")
        if sep and name.strip() == API_KEY:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            return value or None
    return None


def auth_headers(env_file):
    """``{"Authorization": "Bearer <key>"}`` when the env file sets a key, else ``{}``."""
    key = api_key(env_file)
    return {"Authorization": f"Bearer {key}"} if key else {}

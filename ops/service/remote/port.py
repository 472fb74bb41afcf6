"""Before a running server is stopped: is the port the new one will bind free, or held by the
server we are about to stop? Prints {"ok": true} or {"ok": false, "error": ...}.

argv[1]: JSON {port, pid (the running server, or null)}; ``sockets.py`` is prepended.
"""

import json
import sys


def main(s):
    owner = port_owner(s["port"], s["pid"])  # noqa: F821 (from sockets.py)
    if owner:
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": f"port {s['port']} is taken by {owner}, not by the server "
                    "specops runs (fix: stop that process, or set serve.port)",
                }
            )
        )
    else:
        print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

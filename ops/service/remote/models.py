"""The model ids a server on URL (argv[1]) lists, as {"models": [...]}; {"models": null} when
nothing listens there, {"error": ...} when something else answers."""

import json
import sys
import urllib.error
import urllib.request


def main(url):
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            out = {"models": [m["id"] for m in json.load(r)["data"]]}
    except urllib.error.HTTPError as exc:
        out = {"error": f"HTTP {exc.code} from /v1/models"}
    except urllib.error.URLError as exc:
        out = (
            {"models": None} if isinstance(exc.reason, ConnectionRefusedError) else {"error": str(exc.reason)}
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])

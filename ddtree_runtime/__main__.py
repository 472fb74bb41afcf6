"""Entry point: `python -m ddtree_runtime generate|bench ...`."""

from __future__ import annotations

from ddtree_runtime.cli import main

raise SystemExit(main())

"""The server's lifecycle on a host, under the ``service`` and ``bench`` steps (as ``ops/gpu/`` is
for GPUs): read what runs, decide whether it must restart, start it with one of two backends,
prove it answers and that speculation works, and go back when it does not. The server is our
DDTree runtime, vLLM or SGLang (``serve.system``), through the same code.

- ``systems``: what each serving system is (modes, template, venv, packages, readiness);
- ``command``: its command line, rendered from ``templates/serve-<system>.argv.j2``;
- ``settings``: the service arguments and the inventory's ``serve`` mapping (``thresholds``: the
  acceptance gate's);
- ``acceptance``: the gate after a (re)start: tau from the server's own counters, ``min_tau``;
- ``facts``: the read-only probe (``remote/probe.py``);
- ``backends``: systemd and the built-in supervisor (``remote/supervisor.py``), with the health
  wait (``remote/wait.py``);
- ``plan``: restart or not, and the commands; ``rollout``: applying them, with the rollback;
- ``releases``: the release layout and the atomic ``current``/``previous`` switch;
- ``metrics``: the one Prometheus-text parser; ``status``: what ``fab status`` shows.

Imports nothing here so that the benchmark client, which runs on the host, can use ``metrics``.
"""

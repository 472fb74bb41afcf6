"""Service steps: ``service`` (run a release, prove it answers, roll back if not) and ``service_status``.

``service`` takes a host from any state to "the server answers on release R" (our DDTree runtime,
or vLLM / SGLang: ``serve.system``, see ``ops/service/systems.py``): it points
``<base>/current`` at R, (re)starts the server only when the release, the environment file or the
unit changed (or it is down or unhealthy), then waits for ``/health`` and one real completion.
Before it stops a running release for a new one, the new one must pass a start check (``serve
--help`` imports it): a release that cannot even import is refused while the old one keeps
serving. If R starts but does not answer within the timeout, the step switches back to the
release that ran before, restarts it, confirms it answers, and fails with R's log tail; the same
happens when R answers but fails its acceptance gate (tau under ``min_tau``, ``ops/service/acceptance.py``).
``release: previous`` is ``fab rollback``, which (as the automatic rollback) restores the settings
that release last answered with, its env file included (``ops/service/proven.py``); the next
``fab deploy`` renders them from the inventory again. One GPU holds one model, so a restart is a short gap
in service; there is no second copy running side by side.

The lifecycle lives in ``ops/service/``: the probe (``facts``), the two backends, systemd and the
built-in supervisor (``backends``), the plan (``plan``: does it need a restart, and the backend's
commands), applying it with the rollback (``rollout``) and ``fab status``'s summary (``status``).
Either way the server runs in ``<base>/releases/<id>`` with ``PYTHONPATH=<that>/site`` (it keeps
its release even when ``current`` moves), logs to ``<base>/logs/<name>.log``, and a state file
``<base>/run/<name>.state`` records the fingerprint of what was started, which is how a second
deploy knows that nothing changed and keeps the same pid. Secrets stay in the environment file:
the server's command line holds paths and numbers only.
"""

from __future__ import annotations

from ops.api.args import Arg, arguments
from ops.api.changes import Plan, StepFailed
from ops.layout import HostLayout
from ops.service.facts import gather
from ops.service.plan import plan_service
from ops.service.rollout import apply_service
from ops.service.settings import SERVICE_ARGS, serve_arg
from ops.service.status import is_down, status_line, status_summary
from ops.steps.base import Step, register
from specops_contract import SERVICE


@register
class Service(Step):
    name = "service"
    summary = "the server running a release and answering, with automatic rollback"
    args = SERVICE_ARGS

    def probe(self, conn, args, ctx):
        return gather(conn, args)

    def plan(self, facts, args, ctx):
        # fab rollback: the previous release with the settings it last answered with
        return plan_service(facts, args, ctx, proven=args["release"] == "previous")

    def apply(self, conn, plan, ctx):
        return apply_service(conn, plan, ctx)


@register
class ServiceStatus(Step):
    name = "service_status"
    summary = "release, pid/unit, health, uptime and last metrics of the server (read-only)"
    args = arguments(
        base=Arg(str, required=True, help="the host's base directory"),
        serve=Arg(serve_arg, default={}, help="inventory serve vars (host and port are used)"),
        name=Arg(str, default=SERVICE, help="service (unit) name"),
    )

    def probe(self, conn, args, ctx):
        return gather(conn, {**args, "env_file": ""}, metrics=True)

    def plan(self, facts, args, ctx):
        info = status_summary(facts, args)
        if is_down(info):  # fab status exits non-zero
            log = HostLayout(args["base"], args["name"]).log()
            raise StepFailed(f"{status_line(info)} (fix: look at {log}, then fab deploy)")
        return Plan.noop(status_line(info), **info)

"""Release steps: ``release`` (upload + install), ``runtime_venv`` and ``release_prune``.

A release is ``<base>/releases/<id>/`` holding the wheel of this checkout (``id`` is its version,
``0.1.0+g<sha>``), the wheel unpacked into ``site/`` and a ``COMPLETE`` marker with the wheel's
sha256. It is assembled in ``releases/.partial-<id>/`` and renamed into place only when whole, so
a release directory is complete by construction and a cut link leaves at most a partial folder,
whose uploaded wheel the next run reuses when its checksum matches. ``<base>/current`` and
``<base>/previous`` are symlinks switched atomically (a new link renamed over the old one);
``previous`` is what an automatic or a manual rollback goes back to.

The host venv sees the current release through a ``specops.pth`` file naming
``<base>/current/site``: ``<base>/venv/bin/python -m ddtree_runtime ...`` runs the current release,
and switching ``current`` switches it, without pip. Services do not rely on it: they run with
``PYTHONPATH=<base>/releases/<id>/site`` so a running process keeps its own release.

``runtime_venv`` may also name other site-packages folders in that file (inventory var
``venv_site_packages``; ``controller`` means this controller's own site-packages). This lets the
local demo host and the tests reuse the controller's torch instead of installing it again; it
only makes sense when the host is this machine, or has the same Python at the same path.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments, str_list
from ops.api.changes import Fact, Plan, Run, StepFailed, Write
from ops.layout import HostLayout
from ops.service.releases import COMPLETE, layout_fact
from ops.shell import join, quote
from ops.steps.base import Step, register
from ops.wheel import build_wheel

if TYPE_CHECKING:
    from ops.connection import CommandResult

PTH_NAME = "specops.pth"
CONTROLLER = "controller"


# ---------------------------------------------------------------- release
def _release_state(base: str, release: str, wheel: str) -> Fact[dict[str, Any]]:
    layout = HostLayout(base)
    final, partial = quote(layout.release(release)), quote(layout.partial(release))
    command = (
        f"if [ -f {final}/{COMPLETE} ]; then echo complete; cat {final}/{COMPLETE}; "
        f"elif [ -e {final} ]; then echo incomplete; else echo missing; fi; "
        f"if [ -f {partial}/{quote(wheel)} ]; then sha256sum -- {partial}/{quote(wheel)}; fi"
    )
    return Fact(command, parse_release_state)


def parse_release_state(result: CommandResult) -> dict[str, Any]:
    lines = result.stdout.split("\n")
    if not result.ok or lines[0] not in ("complete", "incomplete", "missing"):
        raise StepFailed("cannot inspect the releases folder", command=result.command, stderr=result.stderr)
    state: dict[str, Any] = {"state": lines[0], "installed_sha256": None, "partial_sha256": None}
    rest = [line for line in lines[1:] if line.strip()]
    if state["state"] == "complete" and rest:
        state["installed_sha256"] = rest.pop(0).strip()
    if rest:
        state["partial_sha256"] = rest[0].split()[0]
    return state


@register
class Release(Step):
    name = "release"
    summary = (
        "this checkout's wheel as <base>/releases/<id>/ (uploaded by checksum, unpacked, marked complete)"
    )
    args = arguments(
        base=Arg(str, required=True, help="the host's base directory"),
        python=Arg(str, default="python3", help="host interpreter that unpacks the wheel"),
        source=Arg(str, help="controller checkout to build (default: this one)"),
    )

    def probe(self, conn, args, ctx):
        wheel = build_wheel(args["source"])
        facts = _release_state(args["base"], wheel.release_id, wheel.path.name).gather(conn)
        return {**facts, "release": wheel.release_id, "wheel": str(wheel.path), "sha256": wheel.sha256}

    def plan(self, facts, args, ctx):
        base, release, sha = args["base"], facts["release"], facts["sha256"]
        final = HostLayout(base).release(release)
        data = {"release": release, "dir": final, "sha256": sha}
        if facts["state"] == "complete":
            return Plan.noop(
                f"release {release} is installed (wheel sha256 {(facts['installed_sha256'] or '?')[:12]})",
                **data,
            )
        partial = HostLayout(base).partial(release)
        wheel_name = facts["wheel"].rsplit("/", 1)[-1]
        changes: list[Run | Write] = [
            Run(join(["mkdir", "-p", "--", partial]), why="assemble the release here")
        ]
        if facts["partial_sha256"] != sha:
            with open(facts["wheel"], "rb") as fh:
                changes.append(
                    Write(
                        f"{partial}/{wheel_name}",
                        fh.read(),
                        "0644",
                        f"{partial}/{wheel_name}: wheel sha256 {sha[:12]}\n",
                        why="upload the wheel",
                    )
                )
        finish = [
            join(["rm", "-rf", "--", f"{partial}/site"]),
            join([args["python"], "-m", "zipfile", "-e", f"{partial}/{wheel_name}", f"{partial}/site"]),
            f"printf '%s\\n' {quote(sha)} > {quote(partial + '/' + COMPLETE)}",
        ]
        if facts["state"] == "incomplete":
            finish.append(join(["rm", "-rf", "--", final]))
        finish.append(join(["mv", "-T", "--", partial, final]))
        changes.append(Run(" && ".join(finish), why="unpack, mark complete, rename into place"))
        skipped = "" if facts["partial_sha256"] != sha else " (wheel already uploaded)"
        return Plan.of(changes, f"install release {release}{skipped}", **data)


# ---------------------------------------------------------------- runtime_venv
def controller_site_packages() -> list[str]:
    """This controller interpreter's purelib and platlib folders."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


_VENV_PROBE = (
    "import json, os, sys, sysconfig; p = os.path.join(sysconfig.get_path('purelib'), sys.argv[1]); "
    "t = open(p).read() if os.path.exists(p) else None; "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'pth_path': p, 'pth': t}))"
)
_WRITE_PTH = (
    "import os, sys, sysconfig; p = os.path.join(sysconfig.get_path('purelib'), sys.argv[1]); "
    "t = p + '.tmp'; open(t, 'w').write(sys.argv[2]); os.replace(t, p)"
)


def venv_fact(path: str) -> Fact[dict[str, Any]]:
    python = quote(f"{path}/bin/python")
    command = (
        f"if [ -x {python} ]; then {python} -c {quote(_VENV_PROBE)} {PTH_NAME}; "
        "else echo '{\"missing\": true}'; fi"
    )
    return Fact(command, parse_venv_probe)


def parse_venv_probe(result: CommandResult) -> dict[str, Any]:
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise StepFailed(
            "the venv's python does not run", command=result.command, stderr=result.stderr
        ) from None
    return {"exists": not facts.get("missing"), **{k: v for k, v in facts.items() if k != "missing"}}


@register
class RuntimeVenv(Step):
    name = "runtime_venv"
    summary = "the host venv, seeing the current release (and optional shared site-packages) via specops.pth"
    args = arguments(
        path=Arg(str, required=True, help="venv directory on the host"),
        release_site=Arg(
            str, required=True, help="the current release's site folder, e.g. <base>/current/site"
        ),
        site_packages=Arg(
            str_list,
            default=[],
            help="more folders for the venv's sys.path; "
            "'controller' = this controller's site-packages (same machine only)",
        ),
        python=Arg(
            str,
            help="interpreter that creates the venv (default: the controller's own when "
            "site_packages has 'controller', else python3)",
        ),
    )

    def probe(self, conn, args, ctx):
        return venv_fact(args["path"]).gather(conn)

    def plan(self, facts, args, ctx):
        shared = args["site_packages"]
        uses_controller = CONTROLLER in shared
        paths = [args["release_site"]]
        for item in shared:
            paths.extend(controller_site_packages() if item == CONTROLLER else [item])
        text = "".join(f"{p}\n" for p in dict.fromkeys(paths))
        python = args["python"] or (sys.executable if uses_controller else "python3")
        mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if facts["exists"] and uses_controller and facts["version"] != mine:
            raise StepFailed(
                f"venv {args['path']} has Python {facts['version']} but the controller's "
                f"site-packages are for Python {mine}: remove the venv, or drop 'controller' "
                "from venv_site_packages"
            )
        changes = []
        if not facts["exists"]:  # a venv that borrows the controller's packages installs none itself
            flags = ["--without-pip"] if uses_controller else []
            changes.append(Run(join([python, "-m", "venv", *flags, args["path"]]), why="missing"))
        if facts.get("pth") != text:
            changes.append(
                Run(
                    join([f"{args['path']}/bin/python", "-c", _WRITE_PTH, PTH_NAME, text]),
                    why=f"{PTH_NAME}: {', '.join(dict.fromkeys(paths))}",
                )
            )
        if not changes:
            return Plan.noop(
                f"venv (Python {facts['version']}) sees {len(paths)} release/shared folder(s)",
                python=f"{args['path']}/bin/python",
            )
        verb = "create venv and write" if not facts["exists"] else "write"
        return Plan.of(changes, f"{verb} {PTH_NAME}", python=f"{args['path']}/bin/python")


# ---------------------------------------------------------------- release_prune
def positive_int(value: Any) -> int:
    """A whole number >= 1 ("5" from a rendered template too)."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if isinstance(value, bool) or number < 1:
        raise ValueError(f"expected a whole number >= 1, got {value!r}")
    return number


def releases_to_prune(layout: dict[str, Any], keep: int) -> list[str]:
    """Pure: what goes so that ``keep`` releases stay: current and previous always, then the newest."""
    newest = sorted(layout["releases"], key=lambda r: (layout["releases"][r], r), reverse=True)
    kept = {r for r in (layout["current"], layout["previous"]) if r in layout["releases"]}
    for release in newest:
        if len(kept) >= keep:
            break
        kept.add(release)
    return [r for r in newest if r not in kept]


@register
class ReleasePrune(Step):
    name = "release_prune"
    summary = "old releases removed: N stay, current and previous always among them"
    args = arguments(
        base=Arg(str, required=True, help="the host's base directory"),
        keep=Arg(
            positive_int, default=5, help="releases to keep, counting current and previous (always kept)"
        ),
    )

    def probe(self, conn, args, ctx):
        return layout_fact(args["base"]).gather(conn)

    def plan(self, facts, args, ctx):
        doomed = releases_to_prune(facts, args["keep"])
        if not doomed:
            return Plan.noop(f"{len(facts['releases'])} release(s), keeping up to {args['keep']}")
        layout = HostLayout(args["base"])
        changes = [
            # the release, and the env file its last proven start read (ops/service/proven.py)
            Run(join(["rm", "-rf", "--", layout.release(r), layout.proven_env(r)]), why="old release")
            for r in doomed
        ]
        return Plan.of(changes, f"remove {len(doomed)} old release(s): {', '.join(doomed)}", removed=doomed)

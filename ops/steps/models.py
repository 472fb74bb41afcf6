"""The ``models`` step: download the inventory's checkpoints with the ``hf`` CLI, once.

A checkpoint is complete when ``config.json`` and every file named by its safetensors index (or,
without an index, at least one ``*.safetensors``) are present; complete checkpoints are left alone,
so a re-run downloads nothing. The Hugging Face token comes only from the inventory secret named by
``token_env`` (never from an undeclared variable of the controller's environment), written alone to
a 0600 token file on the host; else from that file if the host already has one. ``hf`` reads it
through ``HF_TOKEN_PATH``: no shell ever evaluates the token (a value holding ``$(...)`` stays text),
and it is never on argv, in a diff or in a log.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any

from ops.api.args import Arg, arguments
from ops.api.changes import Applied, Plan, Run, StepFailed, Write
from ops.layout import HostLayout
from ops.shell import join, quote
from ops.steps.base import Step, register
from ops.steps.gpu import venv_path

DOWNLOAD_TIMEOUT_S = 12 * 3600.0
_DIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODEL_KEYS = ("name", "repo", "revision", "size_gb", "include")


def models_arg(value: Any) -> list[dict[str, Any]]:
    """The inventory's ``models`` list: [{name, repo, revision?, size_gb?, include?}, ...]."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of {{name, repo}} mappings, got {type(value).__name__}")
    models, seen = [], set()
    for i, item in enumerate(value):
        where = f"models[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a mapping like {{name: target, repo: Qwen/Qwen3-8B}}")
        unknown = sorted(set(item) - set(_MODEL_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key '{unknown[0]}' (keys: {', '.join(_MODEL_KEYS)})")
        name, repo = str(item.get("name", "")), str(item.get("repo", ""))
        if not _DIR_NAME.match(name) or name in seen:
            raise ValueError(
                f"{where}.name {name!r} must be a unique directory name (letters, digits, . _ -)"
            )
        if not _REPO.match(repo):
            raise ValueError(f"{where}.repo {repo!r} must be a Hugging Face id like 'Qwen/Qwen3-8B'")
        include = item.get("include") or []
        if isinstance(include, str):
            include = [include]
        seen.add(name)
        models.append(
            {
                "name": name,
                "repo": repo,
                "revision": str(item.get("revision") or "main"),
                "size_gb": float(item.get("size_gb") or 0),
                "include": [str(p) for p in include],
            }
        )
    return models


def missing_files(files: list[str], index: list[str] | None) -> list[str]:
    """Pure completeness rule: what a checkpoint directory still lacks (empty when complete)."""
    present = set(files)
    missing = [] if "config.json" in present else ["config.json"]
    if index is not None:
        missing += [f for f in index if f not in present]
    elif not any(f.endswith(".safetensors") for f in present):
        missing.append("*.safetensors")
    return missing


def probe_checkpoint(conn: Any, directory: str) -> dict[str, Any]:
    """Top-level files, plus nested files the safetensors index names; the index's weight files."""
    if conn.stat(directory) is None:
        return {"files": [], "index": None}
    files = conn.listdir(directory)
    index_name = next((f for f in sorted(files) if f.endswith(".safetensors.index.json")), None)
    index = None
    if index_name is not None:
        try:
            weight_map = json.loads(conn.read_bytes(f"{directory}/{index_name}"))["weight_map"]
            index = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError):
            index = [f"{index_name} (unreadable: re-download)"]
    nested = [f for f in index or [] if "/" in f and conn.stat(f"{directory}/{f}") is not None]
    return {"files": sorted(files) + nested, "index": index}


def token_text(token: str) -> bytes:
    """The token file as huggingface_hub reads it from ``HF_TOKEN_PATH``: the token, nothing else."""
    return f"{token}\n".encode()


def download_command(hf: str, model: dict[str, Any], directory: str, token_file: str | None) -> str:
    """``hf download`` into the model's directory; the token only ever arrives through its file."""
    argv = [hf, "download", model["repo"], "--revision", model["revision"], "--local-dir", directory]
    for pattern in model["include"]:
        argv += ["--include", pattern]
    token = f"HF_TOKEN_PATH={quote(token_file)} " if token_file else ""
    return f"{token}HF_HUB_DISABLE_PROGRESS_BARS=1 {join(argv)}"


@register
class Models(Step):
    name = "models"
    summary = "the inventory's checkpoints under <base>/models/<name>, downloaded once with the hf CLI"
    args = arguments(
        models=Arg(models_arg, default=[], help="[{name, repo, revision?, size_gb?, include?}]"),
        hf=Arg(str, help="hf CLI on the host (default: <venv>/bin/hf, else hf on PATH)"),
        venv=Arg(str, help="venv directory on the host (default <base>/venv)"),
        token_env=Arg(str, default="HF_TOKEN", help="the inventory secret holding the token"),
        token_file=Arg(str, help="0600 token file on the host (default <base>/run/hf.token)"),
    )

    def probe(self, conn, args, ctx):
        layout = HostLayout(ctx.host.base)
        checkpoints = {m["name"]: probe_checkpoint(conn, layout.model(m["name"])) for m in args["models"]}
        token_file = args["token_file"] or layout.hf_token
        token_stat = conn.stat(token_file)
        token = None
        if token_stat is not None:
            token = {
                "mode": f"{token_stat.mode:04o}",
                "sha256": hashlib.sha256(conn.read_bytes(token_file)).hexdigest(),
            }
        hf = args["hf"]
        if hf is None and any(missing_files(**c) for c in checkpoints.values()):
            venv_hf = f"{venv_path(args, ctx)}/bin/hf"
            found = conn.run("command -v hf || true", timeout=30).stdout.strip()
            hf = venv_hf if conn.stat(venv_hf) is not None else (found or venv_hf)
        token_dir = posixpath.dirname(token_file)
        return {
            "checkpoints": checkpoints,
            "token_file": token,
            "token_dir_exists": conn.stat(token_dir) is not None,
            "hf": hf,
        }

    def plan(self, facts, args, ctx):
        if not args["models"]:
            return Plan.noop("no models listed for this host")
        layout = HostLayout(ctx.host.base)
        todo = [
            (m, missing)
            for m in args["models"]
            if (missing := missing_files(**facts["checkpoints"][m["name"]]))
        ]
        if not todo:
            return Plan.noop(
                f"{len(args['models'])} checkpoint(s) complete: "
                + ", ".join(m["name"] for m in args["models"])
            )
        token_file = args["token_file"] or layout.hf_token
        changes: list[Write | Run] = []
        token = ctx.vars.get("secrets", {}).get(args["token_env"])  # declared secrets only
        have = facts["token_file"]
        source = None
        if token:
            wanted = token_text(token)
            if have is None or have["sha256"] != hashlib.sha256(wanted).hexdigest() or have["mode"] != "0600":
                if not facts["token_dir_exists"]:
                    changes.append(
                        Run(
                            join(["mkdir", "-p", "-m", "0700", posixpath.dirname(token_file)]),
                            why="directory of the token file",
                        )
                    )
                changes.append(
                    Write(
                        token_file,
                        wanted,
                        mode="0600",
                        why="token for hf download",
                        diff=f"--- {token_file}\n+++ {token_file}\n+********\n",
                    )
                )
            source = token_file
        elif have is not None:
            if have["mode"] != "0600":
                raise StepFailed(
                    f"{token_file} has mode {have['mode']}; a token file must be private "
                    f"(fix: chmod 600 {token_file})"
                )
            source = token_file
        for model, missing in todo:
            directory = layout.model(model["name"])
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            changes.append(
                Run(
                    download_command(facts["hf"], model, directory, source),
                    timeout=DOWNLOAD_TIMEOUT_S,
                    why=f"{model['name']} lacks {shown}",
                )
            )
        auth = "with the token file" if source else "anonymously (no token)"
        names = ", ".join(m["name"] for m, _ in todo)
        return Plan.of(changes, f"download {names} {auth}", models=[m["name"] for m, _ in todo])

    def apply(self, conn, plan, ctx):
        """Download, then check completeness again: an exit 0 with files missing is a failure."""
        super().apply(conn, plan, ctx)
        for name in plan.data["models"]:
            missing = missing_files(**probe_checkpoint(conn, HostLayout(ctx.host.base).model(name)))
            if missing:
                raise StepFailed(
                    f"model {name}: hf download finished but {', '.join(missing[:3])} is missing "
                    "(fix: check the repo id, revision and include patterns)"
                )
        return Applied(True, plan.reason, dict(plan.data))

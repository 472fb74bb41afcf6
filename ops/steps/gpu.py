"""GPU steps: ``gpu_facts`` (read-only report), ``gpu_policy`` (the profile's requirements, checked
before anything is installed) and ``gpu_smoke`` (after install: torch, Triton, vLLM and our own
kernels really work on this GPU).

The commands and parsers live in ``ops.gpu.facts``, the decisions in ``ops.gpu.policy``; these
steps only gather and hand over, so every decision is tested on captured outputs.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from ops.api.args import Arg, arguments
from ops.api.changes import Plan, StepFailed
from ops.api.context import StepContext
from ops.gpu import facts as gpu_facts
from ops.gpu.gather import gather_env, gather_host
from ops.gpu.pins import ProfilePins, load_pins
from ops.gpu.policy import PROFILES, check, profile_named, sm
from ops.layout import HostLayout
from ops.service.systems import DEFAULT_SYSTEM, SYSTEMS
from ops.shell import join
from ops.steps.base import Step, register

if TYPE_CHECKING:
    from ops.connection import Connection

SMOKE_TESTS = ("torch", "triton", "vllm", "sglang", "kernels")
IMPORT_TESTS = ("vllm", "sglang")  # the serving systems: their package imports in their own venv


def profile_arg(value: Any) -> str:
    return profile_named(value).name


def smoke_test_arg(value: Any) -> str:
    if value not in SMOKE_TESTS:
        raise ValueError(f"unknown smoke test {value!r}; use one of {', '.join(SMOKE_TESTS)}")
    return value


def venv_path(args: dict[str, Any], ctx: StepContext) -> str:
    return args.get("venv") or HostLayout(ctx.host.base).venv


def pins_for(args: dict[str, Any], ctx: StepContext, profile: str) -> ProfilePins:
    pins = load_pins(ctx.find_source(args["pins"]))
    if profile not in pins:
        raise StepFailed(f"{args['pins']} has no pins for profile '{profile}' (fix: add profiles.{profile})")
    return pins[profile]


def describe(host: dict[str, Any]) -> str:
    nvidia = host["nvidia"]
    if not nvidia["present"]:
        return f"no NVIDIA GPU ({nvidia['error']})"
    names = sorted({f"{g['name']} ({sm(g['compute_cap'])})" for g in nvidia["gpus"]})
    return (
        f"{len(nvidia['gpus'])}x {', '.join(names)}, driver {nvidia['driver']}, "
        f"CUDA {nvidia['cuda'] or 'unknown'}"
    )


@register
class GpuFacts(Step):
    name = "gpu_facts"
    summary = (
        "GPU, capability, driver, CUDA, disk, the venv's torch/triton/vllm versions and the serving "
        "systems the host has (read-only)"
    )
    args = arguments(
        venv=Arg(str, help="venv directory on the host (default <base>/venv)"),
        python=Arg(str, default="python3", help="interpreter the venv is made with"),
    )

    def probe(self, conn, args, ctx):
        venv = venv_path(args, ctx)
        host = gather_host(conn, ctx.host.base, args["python"], venv)
        systems = {
            name: gather_env(conn, system.venv(ctx.host.base))
            for name, system in SYSTEMS.items()
            if name != DEFAULT_SYSTEM
        }
        return {"host": host, "env": gather_env(conn, venv), "systems": systems}

    def plan(self, facts, args, ctx):
        row = gpu_facts.summary(facts["host"], facts["env"], facts.get("systems"))
        versions = ", ".join(f"{k} {row[k]}" for k in ("torch", "triton", "vllm") if row[k])
        if facts["env"] is None:
            versions = "no venv yet"
        message = f"{describe(facts['host'])}; {versions or 'venv has no torch, triton or vllm'}"
        if row["systems"]:
            message += f"; serves {row['systems']}"
        return Plan.noop(message, summary=row, **facts)


def model_bytes_needed(conn: Connection, base: str, models: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """GB the listed models still need: those whose directory has no config.json yet.

    Entries are checked properly by the ``models`` step; here a malformed one simply counts nothing.
    """
    need, names = 0.0, []
    for model in models:
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            continue
        if conn.stat(f"{HostLayout(base).model(model['name'])}/config.json") is None:
            need += float(model.get("size_gb") or 0)
            names.append(model["name"])
    return need, names


@register
class GpuPolicy(Step):
    name = "gpu_policy"
    summary = "the profile's requirements: compute capability, driver for the CUDA build, disk, Python"
    args = arguments(
        profile=Arg(profile_arg, required=True, help=f"one of {', '.join(PROFILES)}"),
        pins=Arg(str, default="pins.yaml", help="the pins file, beside the playbook"),
        python=Arg(str, default="python3", help="interpreter the venv is made with"),
        venv=Arg(str, help="venv directory on the host (default <base>/venv)"),
        install=Arg(bool, help="whether the pinned packages will be installed (default: unless profile cpu)"),
        models=Arg(list, default=[], help="the inventory's models (size_gb counts toward the disk need)"),
        min_free_gb=Arg(float, help="override the computed free-disk need"),
    )

    def probe(self, conn, args, ctx):
        venv = venv_path(args, ctx)
        host = gather_host(conn, ctx.host.base, args["python"], venv)
        host["models_gb"], host["models_missing"] = model_bytes_needed(conn, ctx.host.base, args["models"])
        return host

    def plan(self, facts, args, ctx):
        profile = PROFILES[args["profile"]]
        pins = pins_for(args, ctx, profile.name)
        venv_missing = facts["venv_python"] is None
        if args["min_free_gb"] is not None:
            need, what = args["min_free_gb"], "the venv and models (min_free_gb)"
        else:
            parts = []
            need = 1.0  # logs, results, pip caches
            install = profile.needs_gpu if args["install"] is None else args["install"]
            if venv_missing and install:
                need += pins.venv_gb
                parts.append(f"the venv ({pins.venv_gb:g} GB)")
            if facts["models_gb"]:
                need += facts["models_gb"]
                parts.append(f"models {', '.join(facts['models_missing'])} ({facts['models_gb']:g} GB)")
            what = " and ".join(parts) or "logs and results"
        if venv_missing:
            python, which = facts["python"], f"{args['python']} (makes the venv)"
        else:
            python, which = facts["venv_python"], f"the venv's python ({venv_path(args, ctx)})"
        failures = check(
            ctx.host.name,
            profile,
            pins,
            facts,
            need_gb=need,
            need_what=what,
            python=python,
            python_which=which,
        )
        if failures:
            raise StepFailed("\n".join(failures))
        gpu = describe(facts) if profile.needs_gpu else "no GPU needed"
        return Plan.noop(
            f"profile {profile.name}: {gpu}; Python {python}; "
            f"{facts['disk']['free_bytes'] / 1e9:.1f} GB free >= {need:.1f} GB",
            cuda=pins.cuda,
        )


def smoke_script(test: str) -> str:
    if test in IMPORT_TESTS:
        return f"import json, {test}\nprint(json.dumps({{'{test}': {test}.__version__}}))\n"
    script = resources.files("ops.gpu.remote").joinpath(f"smoke_{test}.py").read_text()
    if test == "kernels":  # nothing is deployed yet: this checkout's kernels travel with the script
        sources = {
            f.name: f.read_text()
            for f in resources.files("ddtree_kernels").iterdir()
            if f.name.endswith(".py")
        }
        # the FP8 kernels' PyTorch reference is the runtime's (triton-free) CPU path: it travels too
        sources["fp8_reference.py"] = resources.files("ddtree_runtime").joinpath("fp8.py").read_text()
        script = f"SOURCES = {dict(sorted(sources.items()))!r}\n{script}"
    return script


def _last_json(stdout: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.strip().startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def arch_supported(cap: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch built for `arch_list` has code for a device of capability `cap`.

    A cubin for sm_XY runs on sm_XZ with Z >= Y (same major, not the arch-specific 'a'/'f'
    variants); PTX for compute_XY is JIT-compiled for any device >= XY.
    """
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        if not number.isdigit() or len(number) < 2:
            continue
        major, minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and major == cap[0] and minor <= cap[1]:
            return True
        if kind == "compute" and (major, minor) <= cap:
            return True
    return False


def judge_smoke(test: str, exit_code: int, stdout: str, stderr: str, venv: str) -> str:
    """The one-line verdict of a smoke test: raises StepFailed with cause and fix, or returns a summary."""
    result = _last_json(stdout)
    if test in IMPORT_TESTS:
        if exit_code != 0 or result is None:
            raise StepFailed(
                f"`import {test}` failed in {venv}: {_error_line(stderr)} (fix: re-run provision with "
                f"install enabled, or check the {test} pin in playbooks/pins.yaml)",
                stderr=stderr,
            )
        return f"{test} {result[test]} imports"
    if exit_code != 0 or result is None:
        raise StepFailed(
            f"{test} smoke test could not run in {venv}: {_error_line(stderr)} "
            f"(fix: re-run provision with install enabled)",
            stderr=stderr,
        )
    if test == "kernels":
        return judge_kernels(result)
    if test == "triton":
        if result["error"] or result.get("max_abs_error", 1.0) > 1e-5:
            cause = result["error"] or f"wrong result (max abs error {result['max_abs_error']})"
            raise StepFailed(
                f"Triton {result['triton']} could not run a kernel on the GPU: {cause} (fix: "
                "pin a Triton that supports this GPU; sm_120 needs Triton >= 3.3)"
            )
        return f"Triton {result['triton']} compiled and ran a kernel on {result['device']}"
    if not result["cuda_available"] or not result["devices"]:
        raise StepFailed(
            f"torch {result['torch']} sees no GPU (CUDA build: {result['cuda'] or 'none, CPU-only'}) "
            "(fix: install the CUDA build of torch pinned for the profile, and check `nvidia-smi`)"
        )
    for device in result["devices"]:
        cap = tuple(device["capability"])
        arch = f"sm_{cap[0]}{cap[1]}"
        if not arch_supported(cap, result["arch_list"]) or device["error"]:
            cause = device["error"] or "no kernel image for it"
            raise StepFailed(
                f"GPU {device['index']} ({device['name']}) is {arch} but torch {result['torch']} "
                f"was built for {' '.join(result['arch_list']) or 'no arch'}: {cause} (fix: install "
                f"a torch build that includes {arch}, e.g. the cu128+ wheels for Blackwell)"
            )
    names = ", ".join(
        sorted({f"{d['name']} (sm_{d['capability'][0]}{d['capability'][1]})" for d in result["devices"]})
    )
    return (
        f"torch {result['torch']} (CUDA {result['cuda']}) ran a kernel on {len(result['devices'])}x {names}"
    )


def smoke_verdict(test: str, profile: str | None, exit_code: int, stdout: str, stderr: str, venv: str) -> str:
    """``judge_smoke``, except that a test which found no GPU reports skipped on the cpu profile."""
    skipped = (_last_json(stdout) or {}).get("skipped")
    if not skipped:
        return judge_smoke(test, exit_code, stdout, stderr, venv)
    if profile != "cpu":
        raise StepFailed(
            f"the {test} smoke test found no GPU in {venv}: {skipped} (fix: run the torch smoke test "
            "first; it names what is missing)"
        )
    return f"skipped on profile cpu: {skipped}"


def _kernel_failure(entry: dict[str, Any], result: dict[str, Any]) -> str:
    """One kernel's failure with its cause and fix: no kernel image, out of resources, wrong result."""
    cap = result.get("capability") or [0, 0]
    arch = f"sm_{cap[0]}{cap[1]}"
    what = f"{entry['name']} ({entry.get('config', 'no config chosen')})"
    error = entry.get("error")
    if error is None:
        return (
            f"{what} differs from its PyTorch reference: error {entry['max_error']:.3g} > {entry['tolerance']:.3g} "
            f"(fix: run `TRITON_INTERPRET=0 pytest tests/kernels` on this host to find the failing case)"
        )
    if "no kernel image" in error:
        return (
            f"{what}: {error} (fix: install a torch and Triton built for {arch}: the cu128+ wheels and "
            f"Triton >= 3.3 for Blackwell, as pinned for the profile in playbooks/pins.yaml)"
        )
    if "OutOfResources" in error or "out of resource" in error:
        return (
            f"{what}: {error} (fix: the launch does not fit this {arch} GPU ({result.get('smem_optin')} B of "
            f"shared memory per block): lower the tiles or stages of its row in ddtree_kernels/arch.py and check the "
            f"row with `python -m ddtree_kernels.aot`)"
        )
    return f"{what}: {error} (fix: run `TRITON_INTERPRET=0 pytest tests/kernels` on this host to find the failing case)"


def judge_kernels(result: dict[str, Any]) -> str:
    """The kernel smoke test's verdict: every kernel matched its reference, else each failure with its fix."""
    device = result["device"]
    if result.get("row_error"):
        raise StepFailed(f"{device}: {result['row_error']}")
    failures = [
        _kernel_failure(e, result)
        for e in result["kernels"]
        if e.get("error") is not None or not e["max_error"] <= e["tolerance"]
    ]
    if failures:
        raise StepFailed(
            f"{len(failures)} of {len(result['kernels'])} kernels failed on {device}: " + "; ".join(failures)
        )
    configs = ", ".join(
        f"{e['name']} {e['config']}" for e in result["kernels"] if e["name"].startswith("attention")
    )
    return (
        f"{len(result['kernels'])} kernels match their references on {device} (Triton {result['triton']}, "
        f"{result['row'].split(':')[0]}): {configs}"
    )


@register
class GpuSmoke(Step):
    name = "gpu_smoke"
    summary = (
        "after install: torch sees the GPU with its arch, a Triton kernel and our kernels run, vllm imports"
    )
    args = arguments(
        test=Arg(smoke_test_arg, required=True, help=f"one of {', '.join(SMOKE_TESTS)}"),
        venv=Arg(str, help="venv directory on the host (default <base>/venv)"),
        profile=Arg(str, help="the host's profile: on 'cpu' a kernels test without a GPU reports skipped"),
    )

    def probe(self, conn, args, ctx):
        venv = venv_path(args, ctx)
        python = f"{venv}/bin/python"
        if conn.stat(python) is None:
            return {"venv": venv, "exists": False}
        result = conn.run(join([python, "-"]), stdin=smoke_script(args["test"]), timeout=300)
        return {
            "venv": venv,
            "exists": True,
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr[-4000:],
        }

    def plan(self, facts, args, ctx):
        if not facts["exists"]:
            if ctx.check:
                return Plan.noop(
                    f"{facts['venv']} does not exist yet; the {args['test']} smoke test runs after install"
                )
            raise StepFailed(
                f"no venv at {facts['venv']} for the {args['test']} smoke test "
                "(fix: run the python_venv and pinned_packages steps first)"
            )
        return Plan.noop(
            smoke_verdict(
                args["test"],
                args["profile"],
                facts["exit_code"],
                facts["stdout"],
                facts["stderr"],
                facts["venv"],
            )
        )

"""`fab deploy` of vLLM and SGLang end to end on real sshd hosts, against the stand-in server
(tests/deploy/standin.py: exactly the flags of vLLM 0.34.0 / SGLang 0.5.23, their /metrics names).

The lifecycle is the one our runtime has: the release record with the exact command line and the
installed versions, the 0600 env file, restart only on a change (a new specops release is not
one), readiness as port then /v1/models, the acceptance gate reading tau from the server's own
counters, the rollback to the settings that answered, the lint gate before a DFlash deployment,
and `fab status`.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

from tests.deploy.helpers import complete, deploy, free_port, link, server_pid, step
from tests.deploy.standin import install


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def drafter(tmp_path: Path, name: str, accept: float) -> str:
    """A drafter folder the stand-in reads its acceptance rate from (an EAGLE drafter: no lint)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "standin.json").write_text(json.dumps({"accept": accept}))
    return str(folder)


def host_vars(tiny_pair, checkout, serve: dict, **extra) -> dict:
    return {
        "profile": "cpu",
        "target": str(tiny_pair.target),
        "drafter": str(tiny_pair.drafter),
        "serve": serve,
        "venv_site_packages": ["controller"],
        "release_source": str(checkout.path),
        "deploy_timeout": 60,
        "acceptance": {"requests": 2, "max_tokens": 32},
        **extra,
    }


def test_vllm_deploy_gate_no_restart_on_a_new_release_and_rollback(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    install(base / "venvs" / "vllm", "vllm")
    good, bad = drafter(tmp_path, "eagle-good", 0.8), drafter(tmp_path, "eagle-bad", 0.01)
    port = free_port()
    serve = {"system": "vllm", "mode": "eagle3", "num_speculative_tokens": 3, "port": port}
    results = tmp_path / "results"

    def inventory(**changes) -> Path:
        return make_inventory(
            [h1],
            host_vars={
                "h1": host_vars(tiny_pair, checkout, serve, **{"drafter": good, "min_tau": 2, **changes})
            },
        )

    first = deploy(inventory(), results)
    assert first.ok, first.summary()
    service = step(first, "h1", "service")
    pid = server_pid(base)
    record = json.loads((base / "run" / "specops-ddtree.state").read_text())
    spec_config = {"method": "eagle3", "model": good, "num_speculative_tokens": 3}
    assert record["argv"] == [
        str(base / "venvs" / "vllm" / "bin" / "vllm"),
        "serve",
        str(tiny_pair.target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--speculative-config",
        json.dumps(spec_config),
    ]
    assert cmdline(pid)[1:] == record["argv"]  # what runs is exactly what the release record says
    assert record["system"] == "vllm" and record["pins"] == {"vllm": "0.34.0"}
    assert stat.S_IMODE((base / "run" / "specops-ddtree.env").stat().st_mode) == 0o600
    # floor(0.8 * 3) = 2 drafts accepted a round: tau 3, read from vLLM's own counters
    assert "eagle3 tau 3.00 >= 2 (inventory min_tau)" in service.message, service.message
    gate = json.loads((base / "run" / "specops-ddtree.acceptance.json").read_text())
    assert gate["modes"]["eagle3"]["tau"] == 3.0 and gate["system"] == "vllm"

    # A new specops commit is a new release: `current` moves, vLLM keeps running (same pid).
    checkout.commit("a new commit", {"ops/__init__.py": checkout.read("ops/__init__.py") + "# B\n"})
    release_a = link(base, "current")
    second = deploy(inventory(), results)
    assert second.ok and link(base, "current") != release_a and server_pid(base) == pid, second.summary()
    assert "does not restart it" in step(second, "h1", "service").message

    # A drafter that accepts nothing: the server answers, the gate fails, the settings that
    # answered come back (the good drafter), and the step names the likely fields.
    third = deploy(inventory(drafter=bad), results)
    failure = step(third, "h1", "service")
    assert (
        not third.ok
        and "failed its acceptance gate (acceptance gate: vllm eagle3 tau 1.00 < min_tau 2"
        in (failure.message)
    )
    assert "likely wrong: serve.mode (eagle or eagle3, as the drafter was trained)" in failure.message
    assert "with the settings that answered before, which answers again" in failure.message
    back = server_pid(base)
    assert back != pid and json.loads(cmdline(back)[-1])["model"] == good and complete(port)["choices"]

    status = deploy(inventory(), results, "status.yaml")
    line = step(status, "h1", "service_status").message
    assert f"release {link(base, 'current')}: vllm 0.34.0, pid {back}" in line
    assert "eagle3 passed its gate at tau 3 (min_tau 2)" in line and "DROPPED" not in line


def test_sglang_deploy_reads_sglang_counters_and_the_lint_gate_stops_a_bad_dflash_drafter(
    sshd_hosts, make_inventory, tiny_pair, checkout, servers, tmp_path
):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    install(base / "venvs" / "sglang", "sglang")
    port = free_port()
    serve = {"system": "sglang", "mode": "mtp", "num_speculative_tokens": 3, "port": port}
    results = tmp_path / "results"
    vars_ = host_vars(tiny_pair, checkout, serve, min_tau={"mtp": 2.5}, serve_env={"STANDIN_ACCEPT": 0.7})
    first = deploy(make_inventory([h1], host_vars={"h1": vars_}), results)
    assert first.ok, first.summary()
    pid = server_pid(base)
    argv = cmdline(pid)
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN" and "--enable-metrics" in argv
    # 32 tokens a request, 31 after the first in rounds of 3: SGLang's tokens per verify call
    gate = json.loads((base / "run" / "specops-ddtree.acceptance.json").read_text())
    assert gate["modes"]["mtp"]["tau"] == round(64 / 22, 3) and gate["modes"]["mtp"]["min_tau"] == 2.5

    # The story's fault on a DFlash deployment: a wrong mask_token_id stops it at the lint gate,
    # with its code, before the running server is touched.
    broken = tmp_path / "drafter"
    shutil.copytree(tiny_pair.drafter, broken)
    config = json.loads((broken / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = 10**6
    (broken / "config.json").write_text(json.dumps(config))
    dflash = {**vars_, "serve": {**serve, "mode": "dflash"}, "drafter": str(broken)}
    refused = deploy(make_inventory([h1], host_vars={"h1": dflash}), results)
    lint = step(refused, "h1", "drafter_lint")
    assert not refused.ok and lint.status == "failed" and "DFL01" in lint.message, lint.message
    assert server_pid(base) == pid and complete(port)["choices"]

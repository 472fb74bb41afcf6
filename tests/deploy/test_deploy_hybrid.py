"""`fab deploy` of a tiny Qwen3.5 hybrid pair (sharded `Qwen3_5ForConditionalGeneration` target,
sliding + full drafter) to a real sshd host: linted, started, answering over HTTP."""

from __future__ import annotations

import pytest

from tests.deploy.helpers import complete, deploy, free_port, host_vars, link, running_release, step


@pytest.mark.slow
def test_deploy_serves_a_hybrid_pair(sshd_hosts, make_inventory, hybrid_pair, checkout, servers, tmp_path):
    (h1,) = sshd_hosts(1)
    base = servers(h1.base)
    port = free_port()
    inventory = make_inventory([h1], host_vars={"h1": host_vars(hybrid_pair, checkout, port)})
    result = deploy(inventory, tmp_path / "results")
    assert result.ok, result.summary()
    pid = step(result, "h1", "service").data["pid"]
    assert running_release(pid) == link(base, "current")
    answer = complete(port, prompt="the city of")
    assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 4

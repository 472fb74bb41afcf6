"""Where specops keeps things on a host, named once.

Every step and playbook that needs a path under ``<base>`` asks a :class:`HostLayout` instead of
building the string, so the layout in ``docs/architecture.md`` ("Remote layout") is this one
class. Playbooks see it as ``{{ layout.env_file }}``, ``{{ layout.venv }}``, ...
"""

from __future__ import annotations

from dataclasses import dataclass

from specops_contract import SERVICE


@dataclass(frozen=True)
class HostLayout:
    """The paths under one host's ``base``; ``service`` names the server's files (env, log, pid)."""

    base: str
    service: str = SERVICE

    # -- the Python environment and the releases
    @property
    def venv(self) -> str:
        return f"{self.base}/venv"

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    def system_venv(self, system: str) -> str:
        """The venv of a foreign serving system (``vllm``, ``sglang``): each pins its own torch."""
        return f"{self.base}/venvs/{system}"

    @property
    def releases(self) -> str:
        return f"{self.base}/releases"

    def release(self, release_id: str) -> str:
        """An immutable, complete release (the wheel unpacked into its ``site/``)."""
        return f"{self.releases}/{release_id}"

    def release_site(self, release_id: str) -> str:
        return f"{self.release(release_id)}/site"

    def partial(self, release_id: str) -> str:
        """Where a release is assembled before it is renamed into place."""
        return f"{self.releases}/.partial-{release_id}"

    def link(self, name: str) -> str:
        """``current`` or ``previous``: symlinks to ``releases/<id>``."""
        return f"{self.base}/{name}"

    @property
    def current_site(self) -> str:
        return f"{self.link('current')}/site"

    # -- run state (mode 0700: the env file holds secrets)
    @property
    def run(self) -> str:
        return f"{self.base}/run"

    @property
    def env_file(self) -> str:
        """The server's 0600 ``KEY=VALUE`` file: ``SPECOPS_SERVE_*`` settings and secrets."""
        return f"{self.run}/{self.service}.env"

    @property
    def proven(self) -> str:
        """Copies of the env file each release last answered with (``ops/service/proven.py``)."""
        return f"{self.run}/{self.service}.proven"

    def proven_env(self, release_id: str) -> str:
        return f"{self.proven}/{release_id}.env"

    @property
    def tuned(self) -> str:
        """What ``fab tune`` chose, read back by the ``tuned_settings`` step."""
        return f"{self.run}/{self.service}.tuned.json"

    @property
    def cost_table(self) -> str:
        """The batched rounds' cost on this host (``fab tune``'s ``cost_table`` step), which
        ``tuned_settings`` hands the server as ``--cost-table``."""
        return f"{self.run}/{self.service}.costs.json"

    @property
    def hf_token(self) -> str:
        """The Hugging Face token alone (``hf`` reads it through ``HF_TOKEN_PATH``), mode 0600."""
        return f"{self.run}/hf.token"

    @property
    def deploy_lock(self) -> str:
        return f"{self.run}/deploy.lock"

    def pidfile(self, name: str | None = None) -> str:
        return f"{self.run}/{name or self.service}.pid"

    def state(self, name: str | None = None) -> str:
        """What was started and from which fingerprint (a second deploy with no change keeps the pid)."""
        return f"{self.run}/{name or self.service}.state"

    def acceptance(self, name: str | None = None) -> str:
        """The last passed acceptance gate: tau per mode and its threshold (``fab status`` reads it)."""
        return f"{self.run}/{name or self.service}.acceptance.json"

    # -- logs, scripts, models, results
    @property
    def logs(self) -> str:
        return f"{self.base}/logs"

    def log(self, name: str | None = None) -> str:
        return f"{self.logs}/{name or self.service}.log"

    @property
    def bin(self) -> str:
        return f"{self.base}/bin"

    @property
    def supervisor(self) -> str:
        return f"{self.bin}/specops-supervisor.py"

    @property
    def models(self) -> str:
        return f"{self.base}/models"

    def model(self, name: str) -> str:
        return f"{self.models}/{name}"

    @property
    def demo_models(self) -> str:
        """The tiny demo pair (``target/``, ``drafter/``) written on the host when none is given."""
        return self.model("demo")

    @property
    def results(self) -> str:
        return f"{self.base}/results"

    @property
    def prompts(self) -> str:
        """Prompt sets fetched on the host (``hf:`` datasets), shared by every run."""
        return f"{self.results}/prompts"

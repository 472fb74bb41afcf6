"""The wheel of a checkout, built once and named by version and git commit.

A release must say exactly which code it runs, so the wheel's version is the project version plus
a PEP 440 local label: ``0.1.0+g1a2b3c4`` for a clean commit, ``0.1.0+g1a2b3c4.dirty5e6f7a8b9c``
when the packaged files differ from the commit (the suffix hashes their contents, so the same
edits give the same name). Builds are reproducible (``SOURCE_DATE_EPOCH`` is the commit time), so
a rebuilt wheel has the same checksum and the host skips the upload. The wheel is cached under
``<checkout>/build/wheels/``; hosts deploying in parallel share one build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ops.errors import SpecopsError

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the wheel is made of (pyproject.toml's packages plus its metadata files).
PACKAGED = (
    "ops",
    "ddtree_runtime",
    "ddtree_kernels",
    "drafter_config",
    "specops_files",
    "specops_contract.py",
    "pyproject.toml",
    "README.md",
)
_VERSION_LINE = re.compile(r'^version\s*=\s*"(?P<version>[^"]+)"\s*$', re.M)
KEEP_WHEELS = 5  # the cache keeps the newest few (an edited tree makes a new one per edit)
_BUILD_LOCK = threading.Lock()  # hosts run in threads: one of them builds, the others wait


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str
    sha256: str

    @property
    def release_id(self) -> str:
        """The release directory name on a host: the version says the commit."""
        return self.version


def _git(source: Path, *args: str) -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise SpecopsError("git is not installed on the controller (fix: install git)") from None
    if result.returncode != 0:
        raise SpecopsError(
            f"{source}: git {' '.join(args)} failed: {result.stderr.strip()} "
            "(fix: deploy from a git checkout of specops, with at least one commit)"
        )
    return result.stdout


def packaged_files(source: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files that go into the wheel, sorted."""
    listing = _git(source, "ls-files", "-z", "-co", "--exclude-standard", "--", *PACKAGED)
    return sorted({p for p in listing.split("\0") if p and (source / p).is_file()})


def base_version(source: Path) -> str:
    path = source / "pyproject.toml"
    try:
        match = _VERSION_LINE.search(path.read_text())
    except OSError as exc:
        raise SpecopsError(
            f"{path}: cannot read: {exc.strerror} (fix: deploy from a specops checkout)"
        ) from None
    if not match or "+" in match["version"]:
        raise SpecopsError(
            f"{path}: no plain 'version = \"X.Y.Z\"' line in [project] "
            "(fix: set the version there; the commit is added to it at build time)"
        )
    return match["version"]


def checkout_version(source: Path) -> str:
    """``<version>+g<sha>``, plus ``.dirty<hash>`` when the packaged files have local edits."""
    sha = _git(source, "rev-parse", "--short=7", "HEAD").strip()
    version = f"{base_version(source)}+g{sha}"
    if _git(source, "status", "--porcelain", "--", *PACKAGED).strip():
        digest = hashlib.sha256()
        for rel in packaged_files(source):
            digest.update(rel.encode() + b"\0" + (source / rel).read_bytes() + b"\0")
        version += f".dirty{digest.hexdigest()[:10]}"
    return version


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_wheel(source: str | Path | None = None) -> Wheel:
    """The checkout's wheel, from the cache when this exact version was built before."""
    source = Path(source).resolve() if source is not None else REPO_ROOT
    with _BUILD_LOCK:
        version = checkout_version(source)
        cache = source / "build" / "wheels"
        wanted = cache / f"specops-{version}-py3-none-any.whl"
        if not wanted.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            _build_into(source, version, wanted)
            for old in sorted(cache.glob("specops-*.whl"), key=lambda p: p.stat().st_mtime)[:-KEEP_WHEELS]:
                old.unlink(missing_ok=True)
        return Wheel(wanted, version, _sha256(wanted))


def _build_into(source: Path, version: str, wanted: Path) -> None:
    """Copy the packaged files, stamp the version, build with ``python -m build``, move into the cache."""
    epoch = _git(source, "log", "-1", "--format=%ct").strip()
    with tempfile.TemporaryDirectory(prefix="specops-wheel-") as tmp:
        tree, out = Path(tmp) / "src", Path(tmp) / "out"
        for rel in packaged_files(source):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, tree / rel)
        pyproject = tree / "pyproject.toml"
        pyproject.write_text(_VERSION_LINE.sub(f'version = "{version}"', pyproject.read_text(), count=1))
        command = [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(out),
            str(tree),
        ]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
        )
        built = sorted(out.glob("*.whl")) if out.is_dir() else []
        if result.returncode != 0 or len(built) != 1:
            log = " | ".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise SpecopsError(
                f"building the wheel of {source} failed (fix: `{sys.executable} -m pip install "
                f"build setuptools` on the controller, then read this log): {log}"
            )
        tmp_target = wanted.with_name(f".{wanted.name}.tmp")
        shutil.copyfile(built[0], tmp_target)
        os.replace(tmp_target, wanted)

"""Hostile checkpoints (files users download from the internet), locally and over SFTP to a real sshd:
paths that escape the checkpoint, devices, FIFOs, deep JSON, crafted safetensors offsets, a symlinked
config.json, and a full disk under `patch`."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from drafter_config import LintInputError, lint, load_spec, patch
from ops.connection import connect
from ops.inventory import load_inventory
from ops.runner import REPO_ROOT
from ops.tasks import run_file
from specops_files.store import LocalStore
from tests.diskfull import fill
from tests.lint import corpus
from tests.lint.corpus import mutated
from tests.lint.helpers import by_code

Q3 = corpus.qwen3_drafter()
ROOT = Path(__file__).resolve().parents[2]


def specops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


class RecordingStore(LocalStore):
    """The real local store, remembering every path it opened for reading."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self.opened.append(path)
        return super().read_bytes(path, offset, length)


@pytest.fixture(params=["local", "ssh"])
def place(request, tmp_path, sshd_hosts, make_inventory):
    """(folder to build checkpoints in, store that reads them): the local disk, or an sshd host."""
    if request.param == "local":
        yield tmp_path / "local", LocalStore()
        return
    (h1,) = sshd_hosts(1)
    conn = connect(load_inventory(make_inventory([h1])).hosts["h1"])
    yield h1.base, conn
    conn.close()


def _rewrite_header(path: Path, edit) -> None:
    """Rewrite a safetensors file's JSON header through `edit(header)`, keeping its data bytes."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def test_index_paths_outside_the_checkpoint_are_findings_and_never_opened(place):
    folder, store = place
    d = corpus.write_drafter(folder / "drafter", Q3, shards=2)
    outside = corpus.write_drafter(
        folder / "elsewhere", Q3
    )  # a valid file: were it opened, its tensors would count
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] |= {
        "stolen.a": str(outside / "model.safetensors"),
        "stolen.b": "../elsewhere/model.safetensors",
        "stolen.c": "sub/../../elsewhere/model.safetensors",
        "stolen.d": "/etc/shadow",
    }
    index.write_text(json.dumps(data))
    report = lint(str(d), store=store)
    (finding,) = by_code(report, "DFL062")
    assert finding.message.startswith(
        "weight_map names 4 file(s) outside the checkpoint directory, not read: "
    )
    for name in (
        "/etc/shadow",
        "../elsewhere/model.safetensors",
        "sub/../../elsewhere/model.safetensors",
        str(outside / "model.safetensors"),
    ):
        assert repr(name) in finding.message
    assert finding.file == str(index) and finding.severity == "error"
    assert report.codes() == ["DFL062"]  # the shards inside are read as usual, nothing else is said
    if isinstance(store, LocalStore):
        recorder = RecordingStore()
        lint(str(d), store=recorder)
        assert all(p.startswith(str(d)) for p in recorder.opened), recorder.opened


def test_devices_and_fifos_are_never_read(place):
    folder, store = place
    d = corpus.write_drafter(folder / "drafter", Q3)
    t = corpus.write_target(folder / "target", corpus.qwen3_target())
    (t / "tokenizer.json").unlink()
    (t / "tokenizer.json").symlink_to("/dev/zero")  # would exhaust memory if read to the end
    (t / "special_tokens_map.json").unlink()
    os.mkfifo(t / "special_tokens_map.json")  # would block forever if opened
    (d / "model.safetensors").rename(d / "real.bin")
    os.mkfifo(d / "model.safetensors")
    report = lint(str(d), str(t), store=store)
    (finding,) = by_code(report, "DFL061")
    assert "not a regular file" in finding.message and finding.file == str(d / "model.safetensors")
    config = d / "config.json"
    config.unlink()
    config.symlink_to("/dev/zero")
    with pytest.raises(LintInputError, match=r"config\.json: not a regular file"):
        lint(str(d), str(t), store=store)
    config.unlink()
    os.mkfifo(config)
    with pytest.raises(LintInputError, match="not a regular file"):
        lint(str(d), store=store)


def test_cli_exits_2_on_a_device_config_and_on_deep_json(tmp_path):
    d = corpus.write_drafter(tmp_path / "drafter", Q3)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    run = specops("config", "lint", str(d))
    assert run.returncode == 2 and "not a regular file" in run.stderr and "Traceback" not in run.stderr
    (d / "config.json").unlink()
    (d / "config.json").write_text("[" * 600 + "]" * 600)
    run = specops("config", "lint", str(d), "--format", "json")
    assert run.returncode == 2, run.stderr
    (finding,) = json.loads(run.stdout)["findings"]
    assert finding["code"] == "DFL001" and "nested deeper than 100 levels" in finding["message"]
    assert (finding["line"], finding["col"]) == (1, 101)


def test_deep_json_in_tokenizer_index_and_header_is_a_finding_not_a_crash(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    d = corpus.write_drafter(tmp_path / "drafter", Q3, shards=2)
    t = corpus.write_target(tmp_path / "target", corpus.qwen3_target())
    (t / "tokenizer.json").write_text(deep)  # an unreadable tokenizer file is skipped
    (t / "config.json").write_text('{"a": ' + "{" * 300 + "}" * 300 + "}")
    report = lint(str(d), str(t))
    (finding,) = report.findings
    assert finding.code == "DFL001" and finding.file == str(t / "config.json") and report.unreadable
    corpus.write_target(t, corpus.qwen3_target())
    (t / "tokenizer.json").write_text(deep)
    assert lint(str(d), str(t)).findings == []
    (d / "model.safetensors.index.json").write_text(deep)
    assert any("no readable weight_map" in f.message for f in by_code(lint(str(d), str(t)), "DFL061"))
    (d / "model.safetensors.index.json").unlink()
    shard = d / "model-00001-of-00002.safetensors"
    shard.write_bytes(struct.pack("<Q", len(deep)) + deep.encode())
    assert any("header is not JSON" in f.message for f in by_code(lint(str(d), str(t)), "DFL061"))


@pytest.mark.parametrize(
    ("offsets", "expected"),
    [
        ({"fc.weight": [-2, 0]}, "negative or reversed"),
        ({"norm.weight": "x"}, "no [begin, end] data_offsets"),
        ({"fc.weight": [0, 10**9]}, "past the end of the data"),
        ({"hidden_norm.weight": None}, "overlap"),  # None: move it onto the first tensor's bytes
        ({"norm.weight": [0, 2]}, "needs 128"),
    ],
)
def test_bad_safetensors_offsets_are_findings(place, offsets, expected):
    folder, store = place
    d = corpus.write_drafter(folder / "drafter", Q3)

    def edit(header):
        first = min((v["data_offsets"] for k, v in header.items() if k != "__metadata__"), key=lambda o: o[0])
        for name, value in offsets.items():
            span = header[name]["data_offsets"]
            header[name]["data_offsets"] = (
                [first[0], first[0] + span[1] - span[0]] if value is None else value
            )

    _rewrite_header(d / "model.safetensors", edit)
    report = lint(str(d), store=store)
    (finding,) = by_code(report, "DFL063")
    assert (
        expected in finding.message
        and finding.file == str(d / "model.safetensors")
        and finding.severity == "error"
    )
    assert not by_code(report, "DFL061")  # the tensors are still known: only the offsets are wrong


def _hf_cache(folder: Path, config: dict) -> tuple[Path, Path]:
    """The Hugging Face cache layout: snapshots/<rev>/config.json -> ../../blobs/<sha>."""
    snapshot = corpus.write_drafter(folder / "snapshots" / "abc123", config)
    blob = folder / "blobs" / "0f1e2d"
    blob.parent.mkdir()
    (snapshot / "config.json").rename(blob)
    (snapshot / "config.json").symlink_to("../../blobs/0f1e2d")
    return snapshot, blob


def test_patch_through_a_symlinked_config_writes_the_target(place, tmp_path):
    folder, store = place
    broken = mutated(Q3, dflash_config__mask_token_id=5)
    snapshot, blob = _hf_cache(folder / "hub", broken)
    spec = load_spec(str(corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3))))
    result = patch(store, str(snapshot), spec)
    link = snapshot / "config.json"
    assert result.written and result.target == str(blob) and result.path == str(link)
    assert link.is_symlink() and os.readlink(link) == "../../blobs/0f1e2d"
    assert (
        json.loads(blob.read_text())["dflash_config"]["mask_token_id"] == Q3["dflash_config"]["mask_token_id"]
    )
    (backup,) = snapshot.glob("config.json.bak-*")
    assert json.loads(backup.read_text()) == broken
    assert not patch(store, str(snapshot), spec).changed


def test_cli_patch_names_the_file_written_through_a_link(tmp_path):
    snapshot, blob = _hf_cache(tmp_path / "hub", mutated(Q3, dflash_config__mask_token_id=5))
    spec = corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3))
    run = specops("config", "patch", str(snapshot), "--spec", str(spec))
    assert run.returncode == 0, run.stderr
    assert f"{snapshot / 'config.json'}: patched through the link: wrote {blob} (backup:" in run.stdout


def test_cli_patch_on_a_full_or_read_only_disk_is_a_message(tmp_path, small_fs):
    disk = small_fs(tmp_path / "disk", "512k")
    d = corpus.write_drafter(disk / "drafter", mutated(Q3, dflash_config__mask_token_id=5))
    original = (d / "config.json").read_bytes()
    spec = corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3))
    fill(disk)
    run = specops("config", "patch", str(d), "--spec", str(spec))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "cannot write: No space left on device; the config is unchanged (fix: free space" in run.stderr
    assert (d / "config.json").read_bytes() == original
    assert all(b.read_bytes() == original for b in d.glob("config.json.bak-*"))
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    run = specops("config", "patch", str(d), "--spec", str(spec))
    assert run.returncode == 1 and "cannot write: Read-only file system" in run.stderr, run.stderr


def test_fab_patch_drafter_on_a_full_disk_keeps_config_and_backup(
    sshd_hosts, make_inventory, small_fs, tmp_path
):
    (h1,) = sshd_hosts(1)
    disk = small_fs(h1.base / "models", "512k")
    d = corpus.write_drafter(disk / "drafter", mutated(Q3, dflash_config__mask_token_id=5))
    original = (d / "config.json").read_bytes()
    spec = corpus.write_spec(tmp_path / "spec.yaml", "tiny", corpus.qwen3_spec_values(Q3))
    inventory = make_inventory([h1], host_vars={"h1": {"drafter": str(d), "drafter_spec": str(spec)}})
    fill(disk)
    result = run_file(
        REPO_ROOT / "playbooks" / "patch-drafter.yaml",
        inventory=str(inventory),
        results=str(tmp_path / "results"),
    )
    step = json.loads((result.run_dir / "summary.json").read_text())["hosts"]["h1"]["steps"][0]
    assert step["status"] == "failed"
    assert "writing" in step["message"] and "is unchanged (fix: free space on the host" in step["message"]
    assert (d / "config.json").read_bytes() == original
    assert all(b.read_bytes() == original for b in d.glob("config.json.bak-*"))
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # no temp file left

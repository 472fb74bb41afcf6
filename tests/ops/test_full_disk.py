"""A full remote disk over real sshd (a tmpfs mount as the host's disk): a write fails loudly and
never replaces a file by a short one."""

from __future__ import annotations

import pytest

from ops.connection import connect
from ops.errors import WriteFailed
from ops.inventory import load_inventory
from tests.diskfull import fill


@pytest.fixture
def full_host(sshd_hosts, make_inventory, small_fs):
    """(connection, disk) for an sshd host whose `disk` folder is a small tmpfs."""
    (h1,) = sshd_hosts(1)
    disk = small_fs(h1.base / "disk", "512k")
    conn = connect(load_inventory(make_inventory([h1])).hosts["h1"])
    yield conn, disk
    conn.close()


def test_write_on_a_full_disk_fails_and_keeps_the_original(full_host, tmp_path):
    conn, disk = full_host
    target = str(disk / "state.json")
    original = b'{"release": "r1"}\n' * 400
    conn.write_bytes(target, original)
    fill(disk)
    with pytest.raises(
        WriteFailed, match=r"writing .*state\.json failed: .*; .*state\.json is unchanged \(fix: free"
    ):
        conn.write_bytes(target, b"x" * 200_000)
    assert (disk / "state.json").read_bytes() == original
    wheel = tmp_path / "specops-0.1.0-py3-none-any.whl"
    wheel.write_bytes(bytes(range(256)) * 1058)  # 270,848 bytes, as the wheel that arrived as 4,096
    with pytest.raises(
        WriteFailed, match=r"\.whl failed: the host kept 0 of 270848 bytes \(is its disk full\?\)"
    ):
        conn.put_file(wheel, str(disk / wheel.name))
    with pytest.raises(WriteFailed, match=r"state\.json failed"):  # > 100 requests in flight: refused mid-way
        conn.write_bytes(target, b"y" * 4_000_000)
    small = b"short but not tiny " * 300
    with pytest.raises(WriteFailed):
        conn.write_bytes(target, small)
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "state.json"]  # no temp file left behind
    assert (disk / "state.json").read_bytes() == original
    (disk / "filler").unlink()
    conn.write_bytes(target, small)
    conn.put_file(wheel, str(disk / wheel.name), mode=0o644)
    assert (disk / "state.json").read_bytes() == small and (
        disk / wheel.name
    ).read_bytes() == wheel.read_bytes()
    conn.write_bytes(str(disk / "empty"), b"")
    assert (disk / "empty").read_bytes() == b""


def test_a_full_disk_never_leaves_a_lock_and_an_empty_lock_is_stale(
    sshd_hosts, make_inventory, small_fs, tmp_path, capsys
):
    """Issue 27, item 5: taking the deploy lock on a full disk fails saying so and leaves no (empty)
    lock behind; an empty lock, as older runs left it, is taken over and named."""
    from ops.playbook import load_playbook
    from ops.runner import run_playbook

    (h1,) = sshd_hosts(1)
    run_dir = small_fs(h1.base / "run", "64k")
    book = tmp_path / "locked.yaml"
    book.write_text("name: locked\nlock: true\nsteps:\n  - step: command\n    args: {cmd: 'true'}\n")
    hosts = load_inventory(make_inventory([h1])).select(None)

    def run():
        return run_playbook(load_playbook(book), hosts, results_root=tmp_path / "results", live=False)

    fill(run_dir)
    refused = run()
    [step] = refused.hosts["h1"].steps
    assert step.status == "failed" and step.step == "lock"
    assert (
        f"cannot take the lock {run_dir}/deploy.lock: writing it failed (is the disk full?)" in step.message
    )
    assert f"(fix: free space on the host (df -h {run_dir})" in step.message
    assert sorted(p.name for p in run_dir.iterdir()) == ["filler"]  # no lock, no temp file

    (run_dir / "filler").unlink()
    (run_dir / "deploy.lock").write_text("")  # what a run of an older specops left on a full disk
    capsys.readouterr()
    taken = run()
    assert taken.ok, taken.hosts["h1"].steps
    assert "took over an empty lock (left by a run that could not write it" in capsys.readouterr().out
    assert not (run_dir / "deploy.lock").exists()

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

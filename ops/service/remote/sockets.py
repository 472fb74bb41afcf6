"""Which processes hold a TCP port's listening sockets (Linux ``/proc``); a helper that
``wait.py`` and ``port.py`` include (its text is prepended to theirs), never run alone.

Why: a health answer on the port proves nothing by itself, since another server may hold the
port while ours died on bind. The socket's inode, found among the file descriptors of the
process we started (or its children), does.
"""

import os


def listening_inodes(port):
    """Inodes of the sockets listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def socket_inodes(pid):
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def family(pid):
    """``pid`` and all its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in out:
            out.add(current)
            todo += children.get(current, [])
    return out


def holder(inodes):
    """'pid N (command)' of a process holding one of ``inodes``, or why it cannot be named."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and socket_inodes(entry) & inodes:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    command = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                command = "?"
            return f"pid {entry} ({command[:120]})"
    return "a process this user cannot see"


def port_owner(port, pid):
    """None: nothing listens on ``port``; "": ``pid`` (or a child) listens; else who holds it."""
    listening = listening_inodes(port)
    if not listening:
        return None
    ours = set()
    for member in family(pid) if pid else ():
        ours |= socket_inodes(member)
    return "" if listening & ours else holder(listening)

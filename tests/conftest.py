"""Shared test plumbing: the real-sshd plugin (fixtures sshd_hosts, make_inventory)."""

pytest_plugins = ["tests.sshd"]

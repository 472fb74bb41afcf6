"""GPU host facts, the per-profile requirement policy and the version pins used by provisioning."""

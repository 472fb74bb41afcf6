"""ddtree_runtime."""

"""Model modules (no I/O): the Qwen3 target and the DFlash drafter."""

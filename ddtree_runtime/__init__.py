"""ddtree_runtime: our own DDTree / DFlash speculative-decoding runtime (batch 1, one GPU).

Reading order: `config` (dataclasses from HF config.json), `models/` (Qwen3 target, DFlash drafter;
modules only), `loader` (safetensors, meta-device build), `backend` (the hot-path seams the Triton
kernels replace), `engine` (ar / dflash / ddtree), `tokenizer`, `cli`; `tiny` writes the small
fitted checkpoint pair used by the tests and the local demo.
"""

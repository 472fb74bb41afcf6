"""Train a DFlash drafter for a dense or hybrid target: curation, regeneration, hidden-state
extraction, training (one process, or torchrun over GPUs and hosts), lint, τ evaluation.

`python -m ddtree_runtime.train --target DIR --prompts FILE --out RUN_DIR` (or under `torchrun`).
"""

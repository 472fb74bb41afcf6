"""Train a DFlash drafter for a target: curation, hidden-state extraction, training, lint, τ evaluation.

`python -m ddtree_runtime.train --target DIR --prompts FILE --out RUN_DIR` (or under `torchrun`).
"""

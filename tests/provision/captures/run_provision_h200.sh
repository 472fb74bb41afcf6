#!/bin/sh
# `fab provision` on the H200 device: facts -> policy -> venv -> smoke tests, for real.
# The device image lacks fabric/invoke/paramiko; carry them as wheels in .whl (see the report):
#   fabric invoke paramiko bcrypt pynacl cryptography cffi pycparser decorator deprecated
# Usage (device tool, carry [".whl"]): sh tests/provision/captures/run_provision_h200.sh
# Expected: the vllm smoke test fails there (vllm is not in the image and cannot be installed offline).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 COLUMNS=160
python3 -m fabric provision --inventory tests/provision/captures/h200-inventory.yaml --results "$OUT/results" \
  2>&1 | tee "$OUT/provision.log"
python3 -m fabric provision --inventory tests/provision/captures/h200-inventory.yaml --results "$OUT/results2" \
  2>&1 | tail -12

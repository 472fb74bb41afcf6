set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
(TRITON_INTERPRET=0 timeout 200 python -m pytest -q -x tests/kernels/test_fused_layer.py tests/kernels/test_tree_attention.py tests/kernels/test_kv_compact.py tests/kernels/test_backend.py -p no:cacheprovider 2>&1 | tail -15) | tee $OUT/kernels.log
(SPECOPS_TEST_DEVICE=cuda timeout 150 python -m pytest -q -x tests/runtime/test_graphs.py -p no:cacheprovider 2>&1 | tail -25) | tee $OUT/graphs.log
timeout 240 python benchmarks/roofline.py --contexts 4096 --budgets 64,256 --new-tokens 32 --json $OUT/roofline.json 2>&1 | tee $OUT/roofline.log | tail -30

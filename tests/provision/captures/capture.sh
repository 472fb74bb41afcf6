#!/bin/sh
# Captures the real outputs that tests/provision parses. Run from the repo root on a GPU host:
#   OUT=/some/dir sh tests/provision/captures/capture.sh
# Each command's stdout, stderr and exit code land in $OUT/h200/<name>.{out,err,rc}, bundled as
# $OUT/captures.tar (the device tool brings back few files). Read-only: it changes nothing.
set -u
dir="$OUT/h200"
mkdir -p "$dir"
cap() {
  name=$1; shift
  start=$(date +%s.%N)
  "$@" >"$dir/$name.out" 2>"$dir/$name.err" </dev/null
  echo $? >"$dir/$name.rc"
  echo "$name $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo ?)s rc=$(cat "$dir/$name.rc")"
}
capin() {
  name=$1; script=$2; shift 2
  start=$(date +%s.%N)
  "$@" <"$script" >"$dir/$name.out" 2>"$dir/$name.err"
  echo $? >"$dir/$name.rc"
  echo "$name $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo ?)s rc=$(cat "$dir/$name.rc")"
}
Q=name,compute_cap,driver_version,memory.total
cap nvidia_smi nvidia-smi
cap query_csv_noheader_nounits nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits
cap query_csv nvidia-smi --query-gpu=$Q --format=csv
cap query_csv_noheader nvidia-smi --query-gpu=$Q --format=csv,noheader
cap query_bad_field nvidia-smi --query-gpu=name,no_such_field --format=csv,noheader,nounits
cap help_query_gpu nvidia-smi --help-query-gpu
cap nvidia_smi_version nvidia-smi --version
capin probe ops/gpu/remote/probe.py python3 -
capin smoke_torch ops/gpu/remote/smoke_torch.py python3 -
capin smoke_triton ops/gpu/remote/smoke_triton.py python3 -
cap import_vllm python3 -c "import vllm; print(vllm.__version__)"
cap df_root df -P -B1 /
cap df_tmp df -P -B1 /tmp
cap df_opt df -P -B1 /opt
cap proc_driver_version cat /proc/driver/nvidia/version
cap df_missing df -P -B1 /opt/specops-does-not-exist
cap os_release cat /etc/os-release
cap python_version python3 --version
cap uname uname -srm
cap which sh -c 'command -v python3 uv hf huggingface-cli nvidia-smi; true'
tar -C "$OUT" -cf "$OUT/captures.tar" h200 && rm -r "$dir"

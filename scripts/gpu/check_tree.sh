#!/usr/bin/env bash
# On the device, ~120 s of command time: checks a tree built here (scripts/gpu/pack_device.sh,
# .device/serve.txz and .device/wheels as serve_tests.sh says): op and model parity (the NVRTC
# compile test is left to this machine; the products' tests once more with
# LATTICE_CUDA_GEMV_LEAN=1), greedy text of both random Qwen3-0.6B checkpoints on the GPU and the
# CPU (printed "equal", or "DIFFER" with both texts), the server's tests, then, while under
# 200 s, an A/B of the trigger (one round, 8 streams; CHECK_AB=0 leaves it out). Logs in
# $OUT/logs.tgz. Run: `bash scripts/gpu/check_tree.sh`.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/device_env.sh
export CARGO_MANIFEST_DIR="$PWD/crates/inference"
O=${OUT:-/tmp/gpu-out}; D=/tmp/check_tree; mkdir -p "$O" $D
SECONDS=0
pack() { tar -czf $O/logs.tgz -C $D . 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(STEPS=models bash scripts/gpu/lattice_device.sh > $D/models.log 2>&1) &
mp=$!
.device/cuda_ops --nocapture --test-threads=1 --skip kernels_compile_with_nvrtc > $D/cuda_ops.log 2>&1
.device/cuda_parity --nocapture --test-threads=1 > $D/cuda_parity.log 2>&1
# The products' tests again through the register-lean entries (off by default until measured).
LATTICE_CUDA_GEMV_LEAN=1 .device/cuda_ops --nocapture --test-threads=1 linear > $D/cuda_ops_lean.log 2>&1
grep -hE "test result|FAILED|panicked" $D/cuda_ops.log $D/cuda_parity.log $D/cuda_ops_lean.log
grep -h "recorded step of tiny" $D/cuda_parity.log
pack
wait $mp
echo "### greedy text ($SECONDS s)"
greedy() {
  timeout 40 .device/lattice generate --model "/tmp/gpu-models/$1" --device "$2" ${3:-} \
    --temperature 0 --prompt "The capital of France is" --max-tokens 12 2>/dev/null | tr '\n' ' '
}
for m in qwen3-0.6b-f32 qwen3-0.6b-bf16; do
  flag=; [ $m = qwen3-0.6b-bf16 ] && flag=--bf16
  gpu=$(greedy $m cuda $flag); cpu=$(greedy $m cpu)
  [ -n "$gpu" ] && [ "$gpu" = "$cpu" ] && verdict="equal" || verdict="DIFFER (cpu: '$cpu')"
  echo "$m: GPU '$gpu' $verdict"
done
pack
echo "### serve ($SECONDS s)"
OUT=$D SERVE_TIMEOUT=100 bash scripts/gpu/serve_tests.sh 2>&1 | grep -E "^==|^rc|test result|FAILED"
pack
echo "### A/B ($SECONDS s)"
[ "${CHECK_AB:-1}" = 1 ] && [ $SECONDS -lt 200 ] && VARIANTS="LATTICE_CUDA_TRACE=1 LATTICE_CUDA_TRACE=1,LATTICE_CUDA_EARLY_TRIGGER=0" ROUNDS=1 STREAMS=8 bash scripts/gpu/ab_decode.sh 2>&1 | tee $D/ab.log
pack
echo "### done ($SECONDS s)"

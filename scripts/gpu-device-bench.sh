#!/usr/bin/env bash
# The GPU measurements for a machine that has no Rust toolchain and no network (no model files):
# synthesized models of Qwen 2.5 1.5B's shape (`saguaro synth`, random weights), then
#   - the matmul of each weight type at M = 1, 5 and 16 rows (decode, K+1 verification, SSD tree
#     step) at the 1.5B's FFN and output-head shapes, its GB/s as a share of the memory's peak,
#     with f32 and with f16 arithmetic (`--shader-f16`, where the adapter offers it);
#   - attention over 4,096 cached tokens at 1 and 5 rows, its walk split into 128-slot parts (the
#     default on a GPU) and unsplit (one workgroup per KV head);
#   - AR decoding of the Q4_K_M and the Q8_0 file (tokens/s), and of the Q4_K_M file after a
#     prompt of ~2,800 tokens with attention split and unsplit;
#   - AR, SD and SSD with the model as its own draft, the draft on the GPU and on the CPU, and with
#     a 0.5B-shape draft (the real pair's shapes: random models accept nothing, so only the cost
#     of a round counts there): tokens/s and what a round costs; AR and SD with the self-draft on
#     the GPU again with f16 arithmetic.
#
#   scripts/gpu-device-bench.sh prepare   here: build and strip the binary into .gpu-bench/, with
#                                         the Vulkan loader's Debian package beside it
#   scripts/gpu-device-bench.sh [run]     there, from the repository root, with .gpu-bench copied
#                                         along (see docs/measurements.md)
#
# Environment of `run`: OUT (a folder for the log and the JSON results), SAGUARO (the binary;
# default .gpu-bench/saguaro, else target/release/saguaro), SHAPE (qwen2.5-1.5b; tiny for a
# check), LAYERS (all), PEAK_GBS (4800, an H200's HBM3e), ADAPTER (a GPU name for --adapter),
# MAX_TOKENS (64), ROUNDS (1), REPS (100 calls per timed batch), SPEC_K (4), PAIR (1: the
# 0.5B-draft run), BUDGET (540 s: a step that would end past it is cut short or skipped), QUICK=1
# (a short run on lavapipe, to check the script: one prompt, 8 tokens, 2 reps, no head matmul),
# WORK (target/gpu-bench, the model files).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-run}" = prepare ]; then
  set -e
  target_dir=${CARGO_TARGET_DIR:-target}
  cargo build --release --bin saguaro
  mkdir -p .gpu-bench
  strip -o .gpu-bench/saguaro "$target_dir/release/saguaro"
  echo "built from $(git rev-parse --short HEAD) with $(git status --short -uno | wc -l) changed files, $(date -u)" \
    >.gpu-bench/build.txt
  (cd .gpu-bench && rm -f libvulkan1_*.deb && apt-get download libvulkan1 2>/dev/null)
  du -ch .gpu-bench/* | tail -n 1
  exit 0
fi
[ "${1:-run}" = run ] || { echo "usage: $0 [prepare|run]" >&2; exit 2; }

quick=${QUICK:-0}
bin=${SAGUARO:-}
[ -n "$bin" ] || { [ -f .gpu-bench/saguaro ] && bin=.gpu-bench/saguaro || bin=target/release/saguaro; }
# A copied file may have lost its mode.
[ -x "$bin" ] || chmod +x "$bin" 2>/dev/null
shape=${SHAPE:-qwen2.5-1.5b}
peak=${PEAK_GBS:-4800}
spec_k=${SPEC_K:-4}
work=${WORK:-target/gpu-bench}
if [ "$quick" = 1 ]; then
  max_tokens=${MAX_TOKENS:-8} rounds=${ROUNDS:-1} reps=${REPS:-2} head=() working_set=16
else
  max_tokens=${MAX_TOKENS:-64} rounds=${ROUNDS:-1} reps=${REPS:-100} head=(--head) working_set=1024
fi
pair=${PAIR:-1}
[ "$shape" = tiny ] && pair=0
budget=${BUDGET:-540}
res=${OUT:-$work/results}
mkdir -p "$work" "$res"
started=$(date +%s)
failed=()

section() { printf '\n== %s (at %d s)\n' "$1" $(($(date +%s) - started)); }
# step NAME SECONDS CMD...: run CMD for at most SECONDS, and never past the budget; a failure is
# noted (on stderr: stdout may be a result file) and the run goes on.
step() {
  local name=$1 limit=$2 left=$((budget - ($(date +%s) - started) - 5))
  shift 2
  if [ $left -lt 10 ]; then
    echo "!! $name skipped: the ${budget} s budget is spent" >&2
    failed+=("$name")
    return 1
  fi
  [ $left -lt "$limit" ] && limit=$left
  timeout -k 5 "$limit" "$@"
  local rc=$?
  if [ $rc != 0 ]; then
    [ $rc = 124 ] && echo "!! $name stopped after $limit s" >&2 || echo "!! $name failed (exit $rc)" >&2
    failed+=("$name")
  fi
  return $rc
}

main() {
  section "machine"
  date -u
  echo "$(uname -m), $(nproc) cores; binary $bin: $("$bin" --version)"
  [ -f .gpu-bench/build.txt ] && cat .gpu-bench/build.txt
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv,noheader

  # A bare machine may lack the Vulkan loader: unpack the carried package beside the models (never
  # over /), and name NVIDIA's driver manifest where the loader's own folders hold none.
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    for deb in .gpu-bench/libvulkan1_*.deb; do
      [ -f "$deb" ] && dpkg-deb -x "$deb" "$work/vulkan" && echo "Vulkan loader from $deb"
    done
    export LD_LIBRARY_PATH=$work/vulkan/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ] &&
    ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
    echo "VK_DRIVER_FILES=$icd"
  fi
  export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}

  section "saguaro devices"
  "$bin" devices
  gpu=(--backend gpu)
  [ -n "${ADAPTER:-}" ] && gpu+=(--adapter "$ADAPTER")

  what="$shape in q4_k_m and q8_0"
  [ "$pair" = 1 ] && what+=", and qwen2.5-0.5b in q8_0 (the pair's draft)"
  section "synthesize $what"
  layers=()
  [ -n "${LAYERS:-}" ] && layers=(--layers "$LAYERS")
  model=$work/$shape-q4_k_m.gguf q8=$work/$shape-q8_0.gguf small=$work/qwen2.5-0.5b-q8_0.gguf
  step synth 240 "$bin" synth --shape "$shape" --dtype q4_k_m "${layers[@]}" --out "$model" || return 1
  step synth-q8_0 240 "$bin" synth --shape "$shape" --dtype q8_0 "${layers[@]}" --out "$q8"
  if [ "$pair" = 1 ]; then
    small_layers=()
    [ -n "${LAYERS:-}" ] && small_layers=(--layers $((LAYERS < 24 ? LAYERS : 24)))
    step synth-draft 240 "$bin" synth --shape qwen2.5-0.5b --dtype q8_0 "${small_layers[@]}" --out "$small"
  fi

  prompts=()
  if [ "$quick" = 1 ]; then
    echo '["def quicksort(arr):"]' >"$work/prompts.json"
    prompts=(--prompts "$work/prompts.json")
  fi
  bench() {
    local name=$1
    shift
    echo "-- $name: saguaro bench $*"
    step "$name" 300 "$bin" bench --max-tokens "$max_tokens" --rounds "$rounds" --spec-k "$spec_k" "${prompts[@]}" \
      --json "$@" >"$res/$name.json"
  }

  section "matmul at M = 1, 5, 16: $shape's FFN and head, weights read from memory"
  kernels=(bench-kernels "${gpu[@]}" --model "$model" --rows 1,5,16 --dtypes q4_k,q6_k,q8_0,f16 "${head[@]}"
    --reps "$reps" --working-set-mb "$working_set" --peak-gbs "$peak" --json)
  echo "saguaro ${kernels[*]}"
  step kernels 300 "$bin" "${kernels[@]}" >"$res/kernels.json"
  # One subgroup per workgroup (32 threads on NVIDIA), the default where an adapter computes on the CPU.
  echo "saguaro ${kernels[*]} --matvec-threads 32"
  step kernels-32 300 "$bin" "${kernels[@]}" --matvec-threads 32 >"$res/kernels-32.json"

  section "attention over 4,096 cached tokens, split into 128-slot parts and unsplit"
  for split in 128 0; do
    step "attention-split-$split" 120 "$bin" bench-kernels "${gpu[@]}" --model "$model" --rows 1,5 --dtypes q8_0 \
      --working-set-mb 0 --reps "$reps" --context 4096 --attention-split "$split" --json >"$res/attention-$split.json"
  done
  section "attention over 4,096 cached tokens with an f32 KV cache (the runs above cache f16)"
  step attention-kv-f32 120 "$bin" bench-kernels "${gpu[@]}" --model "$model" --rows 1,5 --dtypes q8_0 \
    --working-set-mb 0 --reps "$reps" --context 4096 --kv-cache f32 --json >"$res/attention-kv-f32.json"

  section "decode (AR) and speculation with a self-draft"
  modes=(--modes ar,sd,ssd)
  # The draft is the target itself, unchanged (no requantization, no pruned head, exact activations on
  # the CPU): it proposes what the target decodes (on the CPU, nearly), so the rounds are all full.
  self=(--draft "$model" --draft-quant none --draft-head 0 --draft-precision exact)
  bench spec-gpu-draft --target "$model" "${self[@]}" "${gpu[@]}" --draft-backend gpu "${modes[@]}"
  bench spec-cpu-draft --target "$model" "${self[@]}" "${gpu[@]}" --draft-backend cpu "${modes[@]}"
  bench ar-q8_0 --target "$q8" "${gpu[@]}" --modes ar
  bench spec-gpu-draft-f16 --target "$model" "${self[@]}" "${gpu[@]}" --draft-backend gpu --modes ar,sd --shader-f16

  section "decode after a long prompt: attention split into 128-slot parts and unsplit"
  # 120 small functions (about 2,800 tokens of the synthesized vocabulary); 30 for a quick check.
  python3 - "$work/long.json" "$([ "$quick" = 1 ] && echo 30 || echo 120)" <<'PY'
import json, sys
text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(int(sys.argv[2])))
json.dump([text + "def main():"], open(sys.argv[1], "w"))
PY
  for split in 128 0; do
    echo "-- long-$split"
    step "long-$split" 200 "$bin" bench --target "$model" "${gpu[@]}" --modes ar --max-tokens "$max_tokens" \
      --rounds "$rounds" --prompts "$work/long.json" --attention-split "$split" --json >"$res/long-$split.json"
  done
  if [ "$pair" = 1 ] && [ -f "$small" ]; then
    section "the pair's shapes: $shape target, qwen2.5-0.5b draft on the CPU"
    bench spec-0.5b-draft --target "$model" --draft "$small" "${gpu[@]}" --draft-backend cpu "${modes[@]}"
  fi

  section "summary"
  python3 scripts/gpu-bench-summary.py "$res" "$peak" || echo "(no summary: the JSON results are in $res)"
  echo
  echo "done in $(($(date +%s) - started)) s; results in $res${failed[*]:+; FAILED: ${failed[*]}}"
  [ ${#failed[@]} = 0 ]
}

main 2>&1 | tee "$res/gpu-bench.log"
exit "${PIPESTATUS[0]}"

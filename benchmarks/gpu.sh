#!/usr/bin/env bash
# GPU throughput figures of docs/performance.md ("GPU"): `lowbw bench` for DDP
# and DiLoCo at W = 1, 8, 32 on the default GPT, and DiLoCo on a GPT-2-small-shaped
# model (12 blocks, d_model 768, 12 heads, context 1024; byte vocabulary, so
# 85M parameters: GPT-2 small's without its 50,257-token embedding).
# Each figure is a median over interleaved timed calls against one replica at
# batch W*b in the same process, with the same precision and micro-batches.
#
#   benchmarks/gpu.sh small OUT_DIR   # the default GPT, both strategies
#   benchmarks/gpu.sh gpt2 OUT_DIR    # GPT-2-small shape, DiLoCo at W = 1 and 8
#   benchmarks/gpu.sh gpt2ddp OUT_DIR # GPT-2-small shape, DDP at W = 1, 8, 32
#   benchmarks/gpu.sh gpt2w32 OUT_DIR # GPT-2-small shape, DiLoCo at W = 32, and
#                                     # W = 8 at four sequences per worker
#   benchmarks/gpu.sh round4 OUT_DIR  # GPT-2-small shape: one replica's MFU at
#                                     # several batch / micro-batch sizes, DiLoCo
#                                     # at W = 8 against the best of them, W = 64
#                                     # resident, and the memory estimate against
#                                     # the allocator's peak (benchmarks/round4.py;
#                                     # its flags after OUT_DIR)
set -euo pipefail
phase=${1:?phase: small or gpt2}
out=${2:?output folder}
mkdir -p "$out"
bench() { python3 -m lowbw bench "$@"; }
# The GPT-2-small shape, in bfloat16 autocast, two timed pairs per figure.
gpt2=(--layers 12 --d-model 768 --heads 12 --seq-len 1024 --autocast bfloat16
      --repeats 2)
case "$phase" in
  small)
    bench --strategy ddp --workers 1,8,32 --rounds 100 --repeats 5 \
      --json-out "$out/gpt_ddp.json"
    bench --strategy diloco --H 50 --workers 1,8,32 --rounds 2 --repeats 5 \
      --json-out "$out/gpt_diloco.json" ;;
  gpt2)
    bench --strategy diloco --H 20 --workers 1 "${gpt2[@]}" --batch-size 8 \
      --minibatch-size 2 --json-out "$out/gpt2_diloco_w1.json"
    bench --strategy diloco --H 10 --workers 8 "${gpt2[@]}" --batch-size 1 \
      --worker-batch 8 --json-out "$out/gpt2_diloco_w8.json" ;;
  gpt2ddp)
    bench --strategy ddp --rounds 10 --workers 1 "${gpt2[@]}" --batch-size 8 \
      --minibatch-size 2 --json-out "$out/gpt2_ddp_w1.json"
    bench --strategy ddp --rounds 10 --workers 8 "${gpt2[@]}" --batch-size 1 \
      --json-out "$out/gpt2_ddp_w8.json"
    bench --strategy ddp --rounds 10 --workers 32 "${gpt2[@]}" --batch-size 1 \
      --json-out "$out/gpt2_ddp_w32.json" ;;
  gpt2w32)
    bench --strategy diloco --H 10 --workers 32 "${gpt2[@]}" --batch-size 1 \
      --worker-batch 4 --json-out "$out/gpt2_diloco_w32.json"
    bench --strategy diloco --H 10 --workers 8 "${gpt2[@]}" --batch-size 4 \
      --minibatch-size 2 --worker-batch 8 --json-out "$out/gpt2_diloco_w8_b4.json" ;;
  round4)
    exec python3 benchmarks/round4.py "$out" "${@:3}" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# fp8 convergence on real text (issue 15): llama3.2_1B trained with bf16 and with each fp8 recipe (hybrid format),
# the four runs side by side on one GPU, then their loss curves compared in 20-step windows
# (tools/compare_loss_curves.py: the table on stdout, curves.svg in OUTDIR).
#
#   tools/fp8_convergence.sh DATA_PREFIX TOKENIZER_MODEL OUTDIR [STEPS=2000]
#
# DATA_PREFIX: a Megatron dataset in Llama 3 tokens (primus-cli data preprocess; tools/realtext_jsonl.py makes the
# real-text corpus); micro-batch 2 × 2048 (MICRO_BATCH, SEQ_LENGTH), lr 3e-4 with 100 warm-up steps, every step
# logged. RUNS picks the runs (default "bf16 tensorwise delayed blockwise"; bf16 is the baseline of the comparison;
# each 1B run takes ~24 GB, so an 80 GB GPU holds two at a time).
# PRIMUS_CLI names the binary (default build/primus-cli). The runs end without writing their 1B checkpoints: each is
# killed once its last step is in its metrics.jsonl.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 DATA_PREFIX TOKENIZER_MODEL OUTDIR [STEPS]" >&2; exit 2; }
data=$1 tokenizer=$2 out=$3 steps=${4:-2000}
cli=${PRIMUS_CLI:-build/primus-cli}
[[ -f $data.idx ]] || { echo "$0: $data.idx not found" >&2; exit 2; }
[[ -f $tokenizer ]] || { echo "$0: $tokenizer not found" >&2; exit 2; }
mkdir -p "$out"
read -r -a runs <<<"${RUNS:-bf16 tensorwise delayed blockwise}"
declare -A pid
for run in "${runs[@]}"; do
  fp8=()
  [[ $run != bf16 ]] && fp8=(fp8_format=hybrid "fp8_recipe=$run")
  "$cli" train pretrain --config configs/H200/llama3.2_1B-bf16-pretrain.yaml "train_iters=$steps" \
    "micro_batch_size=${MICRO_BATCH:-2}" "global_batch_size=${MICRO_BATCH:-2}" "seq_length=${SEQ_LENGTH:-2048}" \
    lr_warmup_iters=100 log_interval=1 eval_interval=0 \
    "data_path=$data" "tokenizer_model=$tokenizer" "workspace=$out" "exp_name=$run" "${fp8[@]}" \
    > "$out/$run.log" 2>&1 &
  pid[$run]=$!
done
while :; do
  alive=0
  for run in "${runs[@]}"; do
    kill -0 "${pid[$run]}" 2>/dev/null || continue
    metrics=$out/$run/metrics.jsonl
    if [[ -f $metrics && $(wc -l < "$metrics") -ge $steps ]]; then kill -9 "${pid[$run]}"; else alive=1; fi
  done
  [[ $alive == 0 ]] && break
  sleep 2
done
args=()
for run in "${runs[@]}"; do
  [[ -s $out/$run/metrics.jsonl ]] || { echo "$0: $run logged no step; see $out/$run.log" >&2; tail -5 "$out/$run.log" >&2; continue; }
  args+=("$run=$out/$run/metrics.jsonl")
done
python3 tools/compare_loss_curves.py "${args[@]}" --window 20 --skip 100 --svg "$out/curves.svg"

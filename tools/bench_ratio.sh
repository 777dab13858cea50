#!/usr/bin/env bash
# The speed ratio against PyTorch on the GPU machine: `benchmark train` on configs/H200/<MODEL>-bf16-pretrain.yaml
# and tools/torch_ref.py on the same shape, alternated ROUNDS times in one session, from a bundle made by
# tools/pack_gpu_bundle.sh (BUNDLE, default .device/lead/bundle.tar.xz; see tools/README.md).
#   ROUNDS=3 MODEL=llama3.2_1B TORCH=llama3_1B:4:4096:1 tools/bench_ratio.sh
set -uo pipefail
bundle=${BUNDLE:-.device/lead/bundle.tar.xz}
mkdir -p /tmp/b && tar -xJf "$bundle" -C /tmp/b
export PRIMUS_CONFIGS_DIR=$PWD/configs PRIMUS_WORKSPACE=/tmp/runs
for _ in $(seq "${ROUNDS:-3}"); do
  LD_LIBRARY_PATH=/tmp/b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} timeout 200 /tmp/b/bin/primus-cli benchmark train \
    --config "configs/H200/${MODEL:-llama3.2_1B}-bf16-pretrain.yaml" --warmup 3 --steps 10 2>&1 | grep -E '^\{'
  CEIL=0 PYTHONUNBUFFERED=1 timeout 200 python3 tools/torch_ref.py "${TORCH:-llama3_1B:4:4096:1}" 2>&1 | grep '"model"'
done

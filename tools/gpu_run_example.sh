#!/usr/bin/env bash
# Example command for the device tool: unpack a bundle made by tools/pack_gpu_bundle.sh (carried as
# .device/lead/bundle.tar.xz, with tinyshakespeare.txt beside it), run GPU tests (TESTS=...), benchmark
# configs/H200/<BENCH>-bf16-pretrain.yaml and the PyTorch reference (TORCH=model:mbs:seq:compile).
set -x
mkdir -p /tmp/b && tar -xJf .device/lead/bundle.tar.xz -C /tmp/b
export LD_LIBRARY_PATH=/tmp/b/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export PRIMUS_CONFIGS_DIR=$PWD/configs PRIMUS_TEST_DATA_DIR=$PWD/.device/lead
nvidia-smi --query-gpu=name,memory.used,clocks.max.sm --format=csv
for t in ${TESTS:-}; do timeout 200 /tmp/b/bin/$t 2>&1 | tail -40 | tee -a $OUT/tests.log; done
for cfg in ${BENCH:-llama3.2_1B}; do
  timeout 240 /tmp/b/bin/primus-cli benchmark train --config configs/H200/$cfg-bf16-pretrain.yaml --warmup 3 --steps 8 ${BENCH_ARGS:-} 2>&1 | tail -15 | tee -a $OUT/bench.log
done
if [ -n "${TORCH:-}" ]; then CEIL=0 PYTHONUNBUFFERED=1 timeout 200 python3 tools/torch_ref.py $TORCH 2>&1 | tail -5 | tee -a $OUT/torch.log; fi

#!/usr/bin/env bash
# README command 1: install, build, prepare the data (GPT-2's tokenizer from its npm package, Debian's fortunes
# as a Megatron indexed dataset) and train the default model (a small Llama) on it, then print a sample it
# generates. `device: auto` picks a GPU when the build has CUDA and one is usable, else the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DPRIMUS_TESTS=OFF
bash scripts/prepare_default_data.sh
exec ./build/primus-cli direct -- train pretrain --config configs/examples/default_cpu.yaml "$@"

#!/usr/bin/env bash
# README command 1: install, build, and train the default model (a small Llama) on English text from
# Debian's fortunes package, then print a sample it generates. CPU only for now.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DPRIMUS_TESTS=OFF
exec ./build/primus-cli direct -- train pretrain --config configs/examples/default_cpu.yaml "$@"

#!/usr/bin/env bash
# README command 2: install, build, and run every test (ctest), then the config/CLI error tests again
# under AddressSanitizer + UndefinedBehaviorSanitizer, then each fuzz target for 60 s (scripts/fuzz.sh). Tests are configured ON explicitly (run_default_job.sh leaves
# PRIMUS_TESTS=OFF in the same build/ cache), and ctest fails when it finds no test to run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"
bash scripts/build.sh -DPRIMUS_WERROR=ON -DPRIMUS_TESTS=ON
ctest --test-dir build --output-on-failure --no-tests=error -j"$(nproc)"

# Bad configs and bad arguments (also Slurm flags and the slurm: section) must fail cleanly under the sanitizers too.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPRIMUS_WERROR=ON -DPRIMUS_TESTS=ON \
  -DPRIMUS_SANITIZE=address,undefined -DPRIMUS_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)" --target primus-cli config_errors_test config_load_test config_overrides_test cli_test \
  config_container_test slurm_script_test
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure --no-tests=error \
  -R '^(Config|Cli|Slurm(Arguments|Job|Script|Time|Section)\.)' -j"$(nproc)"

# The file readers under libFuzzer (docs/fuzzing.md): 60 s per target, failing on any crash, leak, hang or UB.
bash scripts/fuzz.sh 60

#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ in build-fuzz/ with clang 14 (ASan + UBSan, docs/fuzzing.md) and runs each
# for SECONDS (default 60) on a copy of its seed corpus, so the seeds in the repository stay small. Fails when any
# target crashes, leaks, hangs, hits undefined behaviour or allocates past 2 GiB, and prints where the input is.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     targets: config safetensors indexed_dataset tokenizer report
# FUZZ_UNIT_TIMEOUT (default 10 s): the wall-clock time one input may take; raise it for long niced runs on a busy
# machine, where a starved fuzzer otherwise stops on inputs that take milliseconds.
# A run's corpus, log and crash inputs stay in build-fuzz/runs/TARGET/; a crash replays with
#   build-fuzz/fuzz/TARGET_fuzzer CRASH_FILE
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
(( ${#targets[@]} )) || targets=(config safetensors indexed_dataset tokenizer report)

export CCACHE_DIR="${CCACHE_DIR:-$PWD/.ccache}"
# -O1 with line tables only: stack traces name file and line, and CI's cold build is shorter than with -O2 -g.
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DPRIMUS_CUDA=OFF -DPRIMUS_TESTS=OFF -DPRIMUS_FUZZ=ON \
  >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/%/_fuzzer}"

# Leaks and UB stop the run like a crash (UB aborts: the build passes -fno-sanitize-recover=all).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# The targets' scratch files (fuzz/fuzz_input.h): in memory where /dev/shm exists, removed at the end even after a
# crash.
scratch="$(mktemp -d "$( [[ -w /dev/shm ]] && echo /dev/shm || echo /tmp )/primus-fuzz-runs.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  run="build-fuzz/runs/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus" "$run/crashes"
  cp fuzz/corpus/"$t"/* "$run/corpus/"
  dict=()
  [[ -f fuzz/$t.dict ]] && dict=(-dict="fuzz/$t.dict")
  echo "fuzz: $t for ${seconds} s"
  if TMPDIR="$scratch" build-fuzz/fuzz/"${t}"_fuzzer "$run/corpus" "${dict[@]}" -max_total_time="$seconds" \
       -timeout="${FUZZ_UNIT_TIMEOUT:-10}" -rss_limit_mb=2048 -malloc_limit_mb=2048 -artifact_prefix="$run/crashes/" -print_final_stats=1 \
       >"$run/log" 2>&1; then
    # The last status line: executions, coverage, corpus; then the run's execution count and speed.
    grep -E '^#[0-9]+' "$run/log" | tail -1
    grep -E 'stat::(number_of_executed_units|average_exec_per_sec)' "$run/log" | tr '\n' ' '
    echo
  else
    failed+=("$t")
    tail -60 "$run/log"
    echo "fuzz: $t FAILED; input(s): $(ls -d "$run"/crashes/* 2>/dev/null | tr '\n' ' ')"
    echo "fuzz: replay with build-fuzz/fuzz/${t}_fuzzer <input>; full log in $run/log"
  fi
done
if (( ${#failed[@]} )); then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds} s each without a failure"

#!/usr/bin/env bash
# Installs what Primus needs from Debian's packages (Debian 12 "bookworm").
#   scripts/setup.sh          build dependencies and the default job's inputs: its text (fortunes), and Node.js and
#                             npm, which install the pinned npm package that ships its tokenizer (GPT-2's)
#   scripts/setup.sh --test   also what the tests need (PyTorch and numpy for the parity tests, Chromium for the
#                             HTML report rendering test, Podman with runc for the container-mode test, Slurm and
#                             MUNGE for the two-node cluster that tests/cli/slurm_cluster_test starts on localhost,
#                             clang 14 with its libFuzzer runtime and OpenMP for scripts/fuzz.sh)
# Packages already present are skipped, so a second run costs nothing.
set -euo pipefail

packages=(cmake ninja-build ccache g++ pkg-config
          libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
          libgtest-dev libgmock-dev libopenblas-openmp-dev libzstd-dev
          libpcre2-dev libsentencepiece-dev libutf8proc-dev libgloo-dev
          fortunes)
# A Node.js that bundles npm (e.g. NodeSource's nodejs) conflicts with Debian's npm package, so install them only
# when npm is absent.
command -v npm >/dev/null || packages+=(nodejs npm)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3 python3-torch python3-numpy chromium podman runc slurm-wlm munge
             clang-14 libclang-rt-14-dev libomp-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

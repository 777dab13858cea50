#!/usr/bin/env bash
# Packs binaries built on the development machine, plus the shared libraries they need that the GPU machine may
# lack, into one .tar.xz to carry to the GPU machine (the project does not configure there: no OpenBLAS, PCRE2,
# utf8proc, SentencePiece, ...).
#
#   .device/pack_gpu_bundle.sh OUT.tar.xz BINARY...
#
# Libraries come from `ldd` of every binary. Left out, because the GPU machine has its own (newer or
# driver-matched) copies: the C/C++ runtime (libc, libm, libdl, libpthread, librt, ld-linux, libstdc++,
# libgcc_s, libgomp) and the CUDA libraries (libcuda, libcudart, libcublas*, libcudnn*, libnccl*, libnvrtc*).
# The archive holds bin/ and lib/. On the GPU machine, from the repository root (tests find their data there):
#
#   mkdir -p /tmp/bundle && tar -xJf OUT.tar.xz -C /tmp/bundle
#   LD_LIBRARY_PATH=/tmp/bundle/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH /tmp/bundle/bin/NAME
#
# and name the archive's folder in the `run` tool's `carry` (it must be git-ignored; .device/ is).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 OUT.tar.xz BINARY..." >&2
  exit 2
fi
out=$1
shift

skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|ld-linux|libstdc\+\+|libgcc_s|libgomp|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc)'
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"

for binary in "$@"; do
  [[ -x $binary ]] || { echo "$0: $binary is not an executable" >&2; exit 2; }
  cp "$binary" "$stage/bin/"
  # Lines "name => /path (addr)"; a library ldd cannot find ("=> not found") stops the packing.
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $name =~ $skip ]] && continue
    if [[ $path == not ]]; then
      echo "$0: $binary needs $name, which ldd cannot find here" >&2
      exit 3
    fi
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$binary")
done

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" bin lib
echo "$out: $(du -h "$out" | cut -f1) — bin: $(ls "$stage/bin" | tr '\n' ' ')— lib: $(ls "$stage/lib" | tr '\n' ' ')"

#!/usr/bin/env bash
# Builds stowage on the GPU test machine and runs everything that needs a GPU there: the whole
# CTest suite (the CUDA conformance cases run instead of skipping), the self-check, and the
# backend and allocator benchmarks. Results go to OUTDIR (default: $OUT when set, else build/gpu-results) for
# bench/results/.
#
#   tools/fetch-gpu-deps          # here, once: C++ test libraries as .debs into .gpu-deps/
#   tests/gpu/run.sh [OUTDIR]     # there, from the repository root, with .gpu-deps carried
#
# The machine has CUDA 13, CMake, a C++ compiler and python3 with torch 2.11, but no package
# registry: GoogleTest, Google Benchmark and hwloc come from the carried .debs, unpacked into a
# private prefix (never into /).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-${OUT:-$root/build/gpu-results}}"
mkdir -p "$out"
cd "$root"

prefix=/tmp/stowage-deps
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for deb in .gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else
      (cd "$prefix" && ar p "$root/$deb" "$(ar t "$root/$deb" | grep '^data.tar')" | tar -x -J 2>/dev/null \
        || ar p "$root/$deb" "$(ar t "$root/$deb" | grep '^data.tar')" | tar -x --zstd)
    fi
  done
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PATH="$PATH:/usr/local/cuda/bin"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1
  nvcc --version 2>&1 | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
  echo "cpus: $(nproc)"
} | tee "$out/machine.txt"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
status=0
if ! cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTOWAGE_WITH_CUDA=ON \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$out/configure.txt" 2>&1; then
  echo "configure failed:"; tail -40 "$out/configure.txt"; exit 1
fi
grep -E "^-- stowage:" "$out/configure.txt"
if ! cmake --build build/gpu --parallel "$(nproc)" >"$out/build.txt" 2>&1; then
  echo "build failed:"; tail -40 "$out/build.txt"; exit 1
fi

build/gpu/tools/stowage_selfcheck --capacity 80 2>&1 | tee "$out/selfcheck.txt" || status=1
ctest --test-dir build/gpu --output-on-failure -j 4 2>&1 | tee "$out/ctest.txt" | tail -25
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
build/gpu/bench/backend/bench_backend_ops --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_backend_ops.json" \
  --benchmark_out_format=json 2>&1 | tee "$out/bench_backend_ops.txt" || status=1
"build/gpu/bench/allocator/bench_caching_allocator" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_caching_allocator.json" \
  --benchmark_out_format=json 2>&1 | tee "$out/bench_caching_allocator.txt" || status=1
echo "gpu run: $([[ $status -eq 0 ]] && echo passed || echo FAILED); results in $out"
exit $status

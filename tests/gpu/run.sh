#!/usr/bin/env bash
# Builds stowage on the GPU test machine and runs everything that needs a GPU there, in stages:
#   build   configure and build the C++ tree (CUDA on), and install the Python package into the
#           machine's python3 (stowage as torch's CUDA allocator, its .pth hook, libstowage.so)
#   test    the CTest suite (the CUDA cases run instead of skipping), the self-check, and the
#           torch suite tests/gpu/python (stowage as torch's CUDA allocator; the exactness matrix
#           on the GPU, tests/gpu/python/test_exactness_gpu.py)
#   bench   the end-to-end figures: a GPT-2-small training step, a Llama 1.1B loop cycling four
#           sequence lengths (every step) and host time per allocation, stowage beside torch's
#           native allocator in the same run; activation offload on
#           GPT-2 medium (step time, peak, largest batch under 14 GiB); then the backend and
#           allocator micro-benchmarks (skip them with STOWAGE_GPU_MICRO=0); the offloaded
#           optimizer's host kernel, its training step against torch's and torchao's, and the
#           largest model it trains
# Results go to OUTDIR (default: $OUT when set, else build/gpu-results) for bench/results/.
#
#   tools/fetch-gpu-deps                        # here, once: C++ test libraries as .debs
#   tests/gpu/run.sh [OUTDIR] [build test bench]  # there, from the repository root, with
#                                               # .gpu-deps carried; no stages given: all three
#
# The machine has CUDA 13, CMake, a C++ compiler and python3 with torch 2.11, pybind11 and
# scikit-build-core, but no package registry: GoogleTest, Google Benchmark and hwloc come from
# the carried .debs, unpacked into a private prefix (never into /).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-${OUT:-$root/build/gpu-results}}"
shift || true
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(build test bench)
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }
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
# The image's default compiler ($CXX=/opt/gcc/bin/g++) links libstdc++ statically. Libraries that
# Python loads beside torch must use the process's one libstdc++ (two copies' locale tables
# clash: number formatting crashes), so the system compiler builds everything here.
if [[ -x /usr/bin/g++ && -x /usr/bin/gcc ]]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi

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
python="$(command -v python3)"
status=0
if wants build; then
  if ! cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTOWAGE_WITH_CUDA=ON \
      -DPython3_EXECUTABLE="$python" >"$out/configure.txt" 2>&1; then
    echo "configure failed:"; tail -40 "$out/configure.txt"; exit 1
  fi
  grep -E "^-- stowage:" "$out/configure.txt"
  if ! cmake --build build/gpu --parallel "$(nproc)" >"$out/build.txt" 2>&1; then
    echo "build failed:"; tail -40 "$out/build.txt"; exit 1
  fi
  if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$python" -m pip install --no-build-isolation \
      --no-deps --no-index --quiet --config-settings=build-dir=build/gpu-python \
      --config-settings=cmake.define.Python3_EXECUTABLE="$python" . >"$out/install.txt" 2>&1; then
    echo "installing the Python package failed:"; tail -40 "$out/install.txt"; exit 1
  fi
  if compgen -G ".gpu-deps/wheels/*.whl" >/dev/null; then  # torchao, for the optimizer's comparison
    "$python" -m pip install --no-deps --no-index --quiet .gpu-deps/wheels/*.whl >>"$out/install.txt" 2>&1 \
      || echo "installing the carried wheels failed (see install.txt): torchao's comparison will be skipped"
  fi
  "$python" -c "import stowage, stowage._torch as t; print('stowage', stowage.__version__, 'torch allocator', t.has_cuda)"
  library="$("$python" -c "import stowage; print(stowage.c_library_path())")"
  ldd "$library" | grep -q "libstdc++" || { echo "libstowage.so has libstdc++ linked in statically: build with the system compiler"; exit 1; }
fi

if wants test; then
  build/gpu/tools/stowage_selfcheck --capacity 80 2>&1 | tee "$out/selfcheck.txt" || status=1
  ctest --test-dir build/gpu --output-on-failure -j 4 2>&1 | tee "$out/ctest.txt" | tail -25
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  # Its own process: the tests enable stowage before CUDA starts (tests/gpu/python/conftest.py).
  # The exactness suite (test_exactness_gpu.py) needs cuBLAS deterministic: a fixed workspace per
  # stream, read when cuBLAS first runs.
  (cd "$root" && CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}" "$python" -m pytest tests/gpu/python \
    -q -p no:cacheprovider --durations=10 --timeout=240 --junitxml="$out/pytest-gpu.xml" 2>&1 \
    | tee "$out/pytest-gpu.txt" | tail -40)
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if wants bench; then
  "$python" bench/e2e/gpt2_step.py --compare --json "$out/gpt2_step.json" 2>&1 | tee "$out/gpt2_step.txt" || status=1
  "$python" bench/e2e/gpt2_step.py --compare --varlen --json "$out/gpt2_step_varlen.json" 2>&1 \
    | tee "$out/gpt2_step_varlen.txt" || status=1
  # A Llama 1.1B loop cycling four sequence lengths: every step's time, native, stowage and the
  # segment path interleaved (the allocator steady-state issue's GPU target)
  "$python" bench/e2e/llama_cycle_step.py --compare --json "$out/llama_cycle_step.json" 2>&1 \
    | tee "$out/llama_cycle_step.txt" || status=1
  "$python" bench/e2e/host_alloc_time.py --compare --processes 7 --repeats 11 --json "$out/host_alloc_time.json" 2>&1 \
    | tee "$out/host_alloc_time.txt" || status=1
  # Activation offload, GPT-2 medium: every mode's step time and peak, then its largest batch
  # at sequence 1024 under a 14 GiB cap.
  "$python" bench/e2e/offload_step.py --device cuda --compare --json "$out/offload_step.json" 2>&1 \
    | tee "$out/offload_step.txt" || status=1
  "$python" bench/e2e/offload_step.py --device cuda --compare --max-batch --cap-gib 14 \
    --json "$out/offload_max_batch.json" 2>&1 | tee "$out/offload_max_batch.txt" || status=1
  # The offloaded optimizer's host kernel on the GPU machine's cores, against torch's.
  "$python" bench/optimizer/adamw_host.py --reps 15 --json "$out/adamw_host.json" 2>&1 \
    | tee "$out/adamw_host.txt" || status=1
  # The offloaded optimizer in a Llama-style training step (1.1B: hidden 2048, 16 layers, 32K
  # tokens a step, above the T >= 7F/B bound it prints): every optimizer mode, then the largest
  # model the device-only and the offloaded optimizer train (layers doubled, then bisected).
  "$python" bench/optimizer/adamw_step.py --compare --batch 16 --json "$out/adamw_step.json" 2>&1 \
    | tee "$out/adamw_step.txt" || status=1
  for mode in device stowage; do
    "$python" bench/optimizer/adamw_step.py --find-largest --mode "$mode" --hidden 4096 --heads 32 \
      --kv-heads 8 --layers 16 --batch 4 --json "$out/adamw_largest_$mode.json" 2>&1 \
      | tail -3 | tee "$out/adamw_largest_$mode.txt" || status=1
  done
  if [[ "${STOWAGE_GPU_MICRO:-1}" != 0 ]]; then
    build/gpu/bench/backend/bench_backend_ops --benchmark_repetitions=5 \
      --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_backend_ops.json" \
      --benchmark_out_format=json >"$out/bench_backend_ops.txt" 2>&1 || status=1
    build/gpu/bench/allocator/bench_caching_allocator --benchmark_repetitions=5 \
      --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_caching_allocator.json" \
      --benchmark_out_format=json >"$out/bench_caching_allocator.txt" 2>&1 || status=1
  fi
fi
echo "gpu run (${stages[*]}): $([[ $status -eq 0 ]] && echo passed || echo FAILED); results in $out"
exit $status

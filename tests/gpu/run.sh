#!/usr/bin/env bash
# Builds stowage on the GPU test machine and runs what needs a GPU there, in stages ordered by
# value, each inside its own time limit so that one command of the device's 10 minutes runs them
# all and a stage that overruns costs only itself:
#   build     configure and build the C++ tree (CUDA on; no micro-benchmarks unless the bench
#             stage is asked for) and install the Python package into the machine's python3, the
#             two builds side by side                                              (~2 min)
#   test      stage 1: the CTest suite (the CUDA cases run instead of skipping) and the self-check
#             beside the torch suite tests/gpu/python (allocator, activation offload, the offloaded
#             optimizer, fit, the exactness matrix on the GPU); STOWAGE_GPU_TEST_S bounds it (150).
#             Then, alone on the GPU, PyTorch's own allocator tests (97 of test/test_cuda.py, from
#             .gpu-deps/torch-tests) under torch's allocator and under stowage, compared test by
#             test (tests/gpu/torch_allocator_tests/run.py; about 70-80 s a run, estimated);
#             STOWAGE_GPU_TORCH_TESTS_S bounds both runs (200)
#   overlap   "The exact step, overlapped": the offloaded optimizer's step on the 0.85B model
#             (bench/optimizer/adamw_step.py: overlap=True, exact, in_backward against torch's fused
#             AdamW and torchao's CPUOffloadOptimizer, interleaved rounds), activation offload at block
#             boundaries against checkpointing alone with the reload stall counters
#             (bench/e2e/offload_step.py), and fit's predicted step against the measured one
#             (bench/e2e/fit_prediction.py); STOWAGE_GPU_OVERLAP_S bounds it (200)
#   peers     stage 2: bench/e2e/peers_at_budget.py, the largest Qwen2.5-shaped decoder and its
#             tokens/s at a 24 GiB budget for stowage.fit against stock + checkpointing,
#             torchao's CPUOffloadOptimizer, FSDP2 with CPUOffloadPolicy and DeepSpeed's
#             ZeRO-Offload and ZeRO-3 (its wheels carried; its CPU Adam built by ninja there),
#             each system's predicted point first, then the brackets; STOWAGE_GPU_PEERS_S bounds
#             it (240, estimated to hold the predicted points of stowage, torchao, stock and
#             FSDP2; DeepSpeed, the brackets and the whole device, STOWAGE_GPU_PEERS_BUDGETS=
#             "24GiB device", want a command of their own: STOWAGE_GPU_PEERS_S=420 ... build peers)
#   headline  stage 3: bench/e2e/gpu_headline.py, the largest model (stock against fit) and the
#             1.1B model's tokens a step (stock with checkpointing against fit), at bracketing
#             points; STOWAGE_GPU_HEADLINE_S bounds it (270)
#   rest      stage 4, whatever time is left: activation offload's overhead (against save_on_cpu
#             and checkpointing), the offloaded optimizer's step (against torch's and torchao's),
#             the allocator's Llama cycle
#   bench     the earlier end-to-end and micro-benchmarks (GPT-2 steps, host time per allocation,
#             the backend and allocator micro-benchmarks), for a command of their own
# STOWAGE_GPU_DEADLINE_S (default 570) is the whole command's limit: each stage gets at most what
# is left of it. Results go to a work folder, packed after every stage into OUTDIR/results.tgz
# (the device tool brings back at most 8 files) beside OUTDIR/console.txt.
#
#   tools/fetch-gpu-deps                                 # here, once: .debs, torchao's and
#                                                        # expecttest's wheels, torch's test_cuda.py
#   tests/gpu/run.sh [OUTDIR] [build test overlap peers headline rest bench]   # there, from the
#                                                        # repository root, .gpu-deps carried;
#                                                        # default: the first six
#
# The machine has CUDA 13, CMake, a C++ compiler and python3 with torch 2.11, pybind11 and
# scikit-build-core, but no package registry: GoogleTest, Google Benchmark and hwloc come from
# the carried .debs, unpacked into a private prefix (never into /).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
packed="${1:-${OUT:-$root/build/gpu-results}}"
shift || true
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(build test overlap peers headline rest)
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }
started=$SECONDS
deadline=$((started + ${STOWAGE_GPU_DEADLINE_S:-570}))
left() { echo $((deadline - SECONDS)); }
# The smaller of a stage's own bound and what is left of the command's
bound() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }
out=/tmp/stowage-gpu-results
rm -rf "$out"; mkdir -p "$out" "$packed"
exec > >(tee "$packed/console.txt") 2>&1
pack() { tar -czf "$packed/results.tgz.part" -C "$out" . && mv "$packed/results.tgz.part" "$packed/results.tgz"; }
stage_done() { echo "== $1 done at $((SECONDS - started)) s"; pack; }
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
  benchmarks=OFF
  wants bench && benchmarks=ON
  if ! cmake -S . -B build/gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DSTOWAGE_WITH_CUDA=ON \
      -DSTOWAGE_BUILD_BENCHMARKS="$benchmarks" -DPython3_EXECUTABLE="$python" >"$out/configure.txt" 2>&1; then
    echo "configure failed:"; tail -40 "$out/configure.txt"; pack; exit 1
  fi
  grep -E "^-- stowage:" "$out/configure.txt"
  # The C++ tree and the Python package build side by side: together they keep the cores busy
  cmake --build build/gpu --parallel "$(nproc)" >"$out/build.txt" 2>&1 &
  cxx_build=$!
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$python" -m pip install --no-build-isolation \
      --no-deps --no-index --quiet --config-settings=build-dir=build/gpu-python \
      --config-settings=cmake.define.Python3_EXECUTABLE="$python" . >"$out/install.txt" 2>&1
  installed=$?
  wait "$cxx_build" || { echo "build failed:"; tail -40 "$out/build.txt"; pack; exit 1; }
  [[ $installed -eq 0 ]] || { echo "installing the Python package failed:"; tail -40 "$out/install.txt"; pack; exit 1; }
  if compgen -G ".gpu-deps/wheels/*.whl" >/dev/null; then  # torchao, DeepSpeed: the comparisons' peers
    "$python" -m pip install --no-deps --no-index --quiet .gpu-deps/wheels/*.whl >>"$out/install.txt" 2>&1 \
      || echo "installing the carried wheels failed (see install.txt): torchao's and DeepSpeed's comparisons will be skipped"
  fi
  "$python" -c "import stowage, stowage._torch as t; print('stowage', stowage.__version__, 'torch allocator', t.has_cuda)"
  library="$("$python" -c "import stowage; print(stowage.c_library_path())")"
  ldd "$library" | grep -q "libstdc++" || { echo "libstowage.so has libstdc++ linked in statically: build with the system compiler"; exit 1; }
  stage_done build
fi

if wants test; then
  limit=$(bound "${STOWAGE_GPU_TEST_S:-150}")
  ( build/gpu/tools/stowage_selfcheck --capacity 80 >"$out/selfcheck.txt" 2>&1 || echo "self-check FAILED" >>"$out/selfcheck.txt"
    timeout "$limit" ctest --test-dir build/gpu --output-on-failure -j 6 >"$out/ctest.txt" 2>&1 ) &
  cxx_tests=$!
  # Its own process: the tests enable stowage before CUDA starts (tests/gpu/python/conftest.py).
  # The exactness suite (test_exactness_gpu.py) needs cuBLAS deterministic: a fixed workspace per
  # stream, read when cuBLAS first runs. Cheapest files first, so a run cut short still says most.
  CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}" timeout "$limit" "$python" -m pytest \
    tests/gpu/python/test_torch_cuda.py tests/gpu/python/test_offload_gpu.py \
    tests/gpu/python/test_offload_adamw_gpu.py tests/gpu/python/test_fit_gpu.py \
    tests/gpu/python/test_exactness_gpu.py -v -p no:cacheprovider --durations=15 --timeout=120 \
    --junitxml="$out/pytest-gpu.xml" >"$out/pytest-gpu.txt" 2>&1
  [[ $? -eq 0 ]] || status=1
  wait "$cxx_tests"
  tail -4 "$out/selfcheck.txt"; grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$out/ctest.txt" | tail -15
  grep -qE "100% tests passed" "$out/ctest.txt" || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest-gpu.txt" | tail -25
  # After the rest, alone on the GPU: these tests fill the device and cap it.
  limit=$(bound "${STOWAGE_GPU_TORCH_TESTS_S:-200}")
  if [[ ! -f .gpu-deps/torch-tests/test_cuda.py ]]; then
    echo "torch's allocator tests: NOT RUN: no .gpu-deps/torch-tests/test_cuda.py (tools/fetch-gpu-deps fetches it; README, GPU tests)"
  elif (( limit < 30 )); then
    echo "torch's allocator tests: not run, $limit s left"
  else
    timeout $((limit + 30)) "$python" tests/gpu/torch_allocator_tests/run.py --out "$out/torch-allocator-tests" \
      --budget-s "$limit" >"$out/torch-allocator-tests.txt" 2>&1 || status=1
    tail -15 "$out/torch-allocator-tests.txt"
  fi
  stage_done test
fi

if wants overlap; then
  # Each job in turn within the stage's bound: the offloaded optimizer's modes (the issue's step
  # target: overlap=True at most torchao's and at most 1.1x max(host update, forward+backward)),
  # block-boundary offload against checkpointing (at most 3% over it), fit's prediction (within 5%).
  stage_end=$((SECONDS + $(bound "${STOWAGE_GPU_OVERLAP_S:-200}")))
  for job in "adamw_overlapped bench/optimizer/adamw_step.py --compare --batch 16 --rounds 2 --modes device,stowage,stowage_overlapped,stowage_in_backward,torchao" \
             "offload_reloads bench/e2e/offload_step.py --device cuda --compare --modes checkpoint,checkpoint+offload --repeat 3" \
             "fit_prediction bench/e2e/fit_prediction.py --device cuda --models gpt --options device share host --layers 24 --width 2048 --rows 2 --seq 2048 --vocab 32000 --budget 24GiB"; do
    name=${job%% *}; command=${job#* }
    limit=$((stage_end - SECONDS))
    (( limit > 30 )) || { echo "$name: not run, $limit s left"; continue; }
    # shellcheck disable=SC2086  # the command's words
    PYTHONUNBUFFERED=1 timeout "$limit" "$python" $command --json "$out/$name.json" >"$out/$name.txt" 2>&1 \
      || { echo "$name: exit status $? (see $name.txt)"; status=1; }
    tail -14 "$out/$name.txt"
    pack
  done
  stage_done overlap
fi

if wants peers; then
  limit=$(bound "${STOWAGE_GPU_PEERS_S:-240}")
  if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "peers: NOT RUN: no GPU here (its dry run: bench/e2e/peers_at_budget.py --device cpu --small --budgets 40MiB)"
  elif (( limit < 60 )); then
    echo "peers: not run, $limit s left"
  else
    # shellcheck disable=SC2086  # the budgets are words
    PYTHONUNBUFFERED=1 timeout $((limit + 15)) "$python" bench/e2e/peers_at_budget.py --device cuda \
      --budgets ${STOWAGE_GPU_PEERS_BUDGETS:-24GiB} --budget-s "$limit" --json "$out/peers_at_budget.json" \
      --markdown "$out/peers_at_budget.md" 2>&1 | tee "$out/peers_at_budget.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  fi
  stage_done peers
fi

if wants headline; then
  limit=$(bound "${STOWAGE_GPU_HEADLINE_S:-270}")
  PYTHONUNBUFFERED=1 timeout $((limit + 10)) "$python" bench/e2e/gpu_headline.py --device cuda --budget-s "$limit" \
    --json "$out/gpu_headline.json" 2>&1 | tee "$out/gpu_headline.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  stage_done headline
fi

if wants rest; then
  # Each in turn while time is left: activation offload at block boundaries against save_on_cpu
  # and checkpointing; the offloaded optimizer against torch's fused AdamW and torchao's
  # CPUOffloadOptimizer; the allocator's Llama cycle.
  for job in "offload_step bench/e2e/offload_step.py --device cuda --compare" \
             "adamw_step bench/optimizer/adamw_step.py --compare --batch 16" \
             "llama_cycle_step bench/e2e/llama_cycle_step.py --compare"; do
    name=${job%% *}; command=${job#* }
    limit=$(left)
    (( limit > 30 )) || { echo "$name: not run, $limit s left"; continue; }
    PYTHONUNBUFFERED=1 timeout "$limit" "$python" $command --json "$out/$name.json" >"$out/$name.txt" 2>&1 \
      || echo "$name: exit status $? (see $name.txt)"
    tail -12 "$out/$name.txt"
    pack
  done
  stage_done rest
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
echo "gpu run (${stages[*]}): $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $((SECONDS - started)) s; results in $packed/results.tgz"
pack
exit $status

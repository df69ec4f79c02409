#!/usr/bin/env bash
# Interleaved: main's package (PYTHONPATH) and this branch's, in_backward and exact, 3 rounds.
cd /work/wt-outofplace
PY=/root/.cache/stowage/venv-wt-outofplace/bin/python
ARGS="--hidden 1024 --layers 4 --heads 8 --kv-heads 2 --vocab 16000 --seq 8 --batch 1 --steps 4 --warmup 1 --json -"
for round in 1 2 3; do
  for mode in stowage_in_backward stowage; do
    for build in main branch; do
      uptime | sed 's/.*load average: //' > ${OUT:-/tmp/oop-bench}/load-$round-$mode-$build.txt
      if [ $build = main ]; then
        PYTHONPATH=/tmp/outofplace-main-pkg $PY bench/optimizer/adamw_step.py --mode $mode $ARGS 2>>${OUT:-/tmp/oop-bench}/stderr-$round-$mode-$build.txt | tail -1 > ${OUT:-/tmp/oop-bench}/$round-$mode-$build.json
      else
        $PY bench/optimizer/adamw_step.py --mode $mode $ARGS 2>>${OUT:-/tmp/oop-bench}/stderr-$round-$mode-$build.txt | tail -1 > ${OUT:-/tmp/oop-bench}/$round-$mode-$build.json
      fi
    done
  done
done
echo done > ${OUT:-/tmp/oop-bench}/finished

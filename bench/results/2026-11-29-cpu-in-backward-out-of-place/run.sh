#!/usr/bin/env bash
# in_backward (main, branch) and exact (branch), interleaved, 3 rounds.
cd /work/wt-outofplace
PY=/root/.cache/stowage/venv-wt-outofplace/bin/python
OUT=${OUT:-/tmp/oop-bench4}
ARGS="--hidden 1024 --layers 4 --heads 8 --kv-heads 2 --vocab 16000 --seq 8 --batch 1 --steps 4 --warmup 1 --json -"
for round in 1 2 3; do
  for run in stowage_in_backward:main stowage_in_backward:branch stowage:branch; do
    mode=${run%%:*}; build=${run##*:}
    uptime | sed 's/.*load average: //' > $OUT/load-$round-$mode-$build.txt
    path=""; [ $build = main ] && path=/tmp/outofplace-main-pkg
    PYTHONPATH=$path $PY bench/optimizer/adamw_step.py --mode $mode $ARGS 2>>$OUT/stderr-$round-$mode-$build.txt \
      | tail -1 > $OUT/$round-$mode-$build.json
  done
done
echo done > $OUT/finished

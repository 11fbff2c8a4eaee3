#!/usr/bin/env bash
# What sessions 21-22 left for the GPU (docs/benchmarks.md, "Pending on the GPU"), in two device calls of < 10 min:
#   run: source .device/env.sh; bash bench/gpu_pending.sh a $OUT
#   run: source .device/env.sh; bash bench/gpu_pending.sh b $OUT
# Part b compares pile_1m with session 20's landed code when a copy of it sits in _dev/s20 (made here, before the
# call: mkdir -p _dev/s20 && git archive a48cd19 | tar -x -C _dev/s20; untracked files travel with the tree).
part=${1:?usage: bench/gpu_pending.sh a|b OUT_DIR}
out=${2:?usage: bench/gpu_pending.sh a|b OUT_DIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$part" = a ]; then
    echo "== bench vla, heavy tail: the ordered row and the growth column"
    timeout 300 python run.py bench vla --arch cuda --dists heavy --repeats 10 --kernel-times --out "$out" 2>&1 \
        | grep -v Warning | tail -12
    echo "== VLA tests on CUDA (both runs)"
    SMOLVLA_TEST_ARCH=cuda timeout 170 python -m pytest tests/test_vla.py tests/test_vla_limits.py -q -x \
        -p no:cacheprovider -n 0 2>&1 | tail -3
    echo "== bench sim boulders: the large-body pass on and off"
    timeout 120 python run.py bench sim --arch cuda --scenes boulders --storages "vla,vla+sim.large_body_factor=0" \
        --repeats 3 --out "$out/boulders" 2>&1 | tail -6
else
    echo "== bench sim pile_1m, the code of now"
    timeout 280 python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla,padded \
        --out "$out/now" 2>&1 | tail -6
    if [ -d _dev/s20 ]; then
        echo "== bench sim pile_1m, session 20's landed code (a48cd19)"
        (cd _dev/s20 && timeout 200 python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla \
            --out "$out/s20" 2>&1 | tail -6)
        echo "== bench sim pile_1m, the code of now again (vla)"
        timeout 200 python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla \
            --out "$out/now2" 2>&1 | tail -6
    fi
fi

#!/usr/bin/env bash
# The two device calls of session 23 that measured what sessions 21 and 22 had left for the GPU (docs/benchmarks.md,
# "Session 23"; raw logs docs/results/h200/gpu_pending_s23_{a,b}.log), kept to re-run them: most important first,
# each step getting what is left of the call's PENDING_BUDGET (570 s by default), at most its own limit:
#   run: source .device/env.sh; bash bench/gpu_pending.sh a $OUT
#   run: source .device/env.sh; bash bench/gpu_pending.sh b $OUT
# Part b (session 23's second call): the flat read's thread/unroll sweep, pile_1m twice more, boulders on/off.
# Part c (session 24): the VLA bench in rounds (medians), the flat read through flat_reduce; VLA tests on CUDA.
#   run: source .device/env.sh; bash bench/gpu_pending.sh c $OUT
# Part d (session 24): the other two length distributions in rounds with flat_reduce; pile_1m against dynamic.
part=${1:?usage: bench/gpu_pending.sh a|b|c|d OUT_DIR}
out=${2:?usage: bench/gpu_pending.sh a|b|c|d OUT_DIR}
mkdir -p "$out"
t0=$SECONDS
left() {  # seconds for the next step: its own limit, or what is left of 570 s
    local l=$((${PENDING_BUDGET:-570} - (SECONDS - t0)))
    [ "$l" -gt "$1" ] && l=$1
    [ "$l" -lt 5 ] && l=5
    echo "$l"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$part" = a ]; then
    echo "== bench vla, heavy tail: the ordered rows and the growth column"
    timeout "$(left 300)" python run.py bench vla --arch cuda --dists heavy --repeats 10 --kernel-times --out "$out" \
        2>&1 | grep -v Warning | tail -14
    echo "== bench sim pile_1m, the code of now ($((SECONDS - t0)) s)"
    timeout "$(left 200)" python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla,padded \
        --out "$out/now" 2>&1 | tail -6
    echo "== VLA tests on CUDA, both runs ($((SECONDS - t0)) s)"
    SMOLVLA_TEST_ARCH=cuda timeout "$(left 200)" python -m pytest tests/test_vla.py tests/test_vla_limits.py -q -x \
        -p no:cacheprovider -n 0 2>&1 | tail -3
elif [ "$part" = c ]; then
    echo "== bench vla, heavy tail: every store, ${ROUNDS:-5} rounds taking turns, the flat read in several forms"
    timeout "$(left 330)" python run.py bench vla --arch cuda --dists heavy --repeats 10 \
        --kernel-times --rounds "${ROUNDS:-5}" --flat-sweep walk8,fold4,fold8,fold16,fold32 --out "$out/vla_rounds" \
        2>&1 | grep -v Warning | tail -24
    echo "== VLA tests on CUDA ($((SECONDS - t0)) s)"
    SMOLVLA_TEST_ARCH=cuda timeout "$(left 230)" python -m pytest tests/test_vla.py tests/test_vla_limits.py \
        tests/test_vla_debug.py -q -x -p no:cacheprovider -n 0 2>&1 | tail -3
elif [ "$part" = d ]; then
    echo "== bench vla, uniform 0-16 and 0-1024: every store, ${ROUNDS:-3} rounds, the flat read through flat_reduce too"
    timeout "$(left 300)" python run.py bench vla --arch cuda --dists uniform16,uniform1024 --repeats 10 \
        --kernel-times --rounds "${ROUNDS:-3}" --flat-sweep walk8,fold4,fold8 --out "$out/vla_uniform" \
        2>&1 | grep -v Warning | tail -24
    echo "== bench sim pile_1m, vla against dynamic ($((SECONDS - t0)) s)"
    timeout "$(left 300)" python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla,dynamic \
        --out "$out/pile_dynamic" 2>&1 | tail -6
else
    echo "== bench vla, heavy tail: padded and VLA rows again, the flat read also with other threads x unrolls"
    timeout "$(left 240)" python run.py bench vla --arch cuda --dists heavy --stores padded,vla --repeats 10 \
        --kernel-times --flat-sweep 524288x4,262144x8,walk8,walk16,walk32 --out "$out/vla_sweep" 2>&1 \
        | grep -v Warning | tail -10
    echo "== bench sim pile_1m, vla, run 1 ($((SECONDS - t0)) s)"
    timeout "$(left 150)" python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla \
        --out "$out/pile_1" 2>&1 | tail -3
    echo "== bench sim boulders: the large-body pass on and off ($((SECONDS - t0)) s)"
    timeout "$(left 120)" python run.py bench sim --arch cuda --scenes boulders \
        --storages "vla,vla+sim.large_body_factor=0" --repeats 3 --out "$out/boulders" 2>&1 | tail -6
    echo "== bench sim pile_1m, vla, run 2 ($((SECONDS - t0)) s)"
    timeout "$(left 150)" python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla \
        --out "$out/pile_2" 2>&1 | tail -3
fi
echo "== done ($((SECONDS - t0)) s)"

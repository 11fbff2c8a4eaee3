#!/usr/bin/env bash
# Every figure of docs/benchmarks.md, on a machine with an NVIDIA GPU, in parts:
#   bash bench/gpu_suite.sh OUT_DIR [PART...]     PART: vla sim solver pile viewer batch (default: all, in order)
# Parts run apart, so that the suite can be spread over shorter sessions; each step is time-boxed so that one slow
# step cannot take the others down; raw results go to OUT_DIR. A first CUDA run of the simulator compiles its kernels
# for about 100 s per body capacity; Taichi's offline cache keeps them for the next runs at that capacity.
out=${1:?usage: bench/gpu_suite.sh OUT_DIR [vla|sim|solver|pile|viewer|batch ...]}
shift
parts=${*:-vla sim solver pile viewer batch}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
part() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
if part vla; then
echo "== VLA tests on CUDA"
SMOLVLA_TEST_ARCH=cuda timeout 300 python -m pytest tests/vla -q -x -p no:cacheprovider -n 0 2>&1 | tail -2
echo "== bench vla"
timeout 600 python run.py bench vla --arch cuda --dists heavy --repeats 10 --kernel-times --rounds 7 --out "$out/vla_heavy" 2>&1 | tail -14
timeout 300 python run.py bench vla --arch cuda --dists uniform1024 --repeats 10 --kernel-times --out "$out/vla_uniform" 2>&1 | tail -10
echo "== dynamic storage: run.py's sparse-data pool holds pile_1m's lists filled to their maximum"
timeout 90 python -m bench.dev.dynamic_pool 2>&1 | tail -1
fi
if part sim; then
echo "== bench sim"
timeout 400 python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla,padded,dynamic --out "$out/sim_pile_1m" 2>&1 | tail -8
timeout 300 python run.py bench sim --arch cuda --steps 100 --scenes pile_100k --storages vla,padded --out "$out/sim_pile_100k" 2>&1 | tail -8
timeout 300 python run.py bench sim --arch cuda --steps 100 --scenes capsule_pile_100k --storages vla \
    --out "$out/sim_capsule_pile_100k" 2>&1 | tail -6
echo "== convex hulls and static triangles (a first run compiles for about 3 minutes: the json's warmup_seconds)"
for scene in junkyard_100k convex_pile_100k hills; do
  timeout 300 python run.py bench sim --arch cuda --steps 100 --scenes $scene --storages vla \
      --out "$out/sim_$scene" 2>&1 | tail -3
done
timeout 200 python run.py bench sim --arch cuda --steps 500 --warmup 1500 --scenes junkyard,rain --storages vla \
    --out "$out/sim_junkyard_rain" 2>&1 | tail -6
timeout 300 python run.py bench sim --arch cuda --scenes boulders --storages "vla,vla+sim.large_body_factor=0" --repeats 3 --out "$out/sim_boulders" 2>&1 | tail -8
fi
if part solver; then
echo "== solver fidelity: the Box3D suite scenes at one body capacity (they share compiled kernels)"
timeout 500 python run.py bench sim --arch cuda --steps 10000 --warmup 20 --capacity 16384 --scenes pyramid_100 \
    --storages "vla,vla+sim.sleep_speed=0" --out "$out/sim_pyramid_100" 2>&1 | tail -6
timeout 300 python run.py bench sim --arch cuda --steps 2000 --warmup 20 --capacity 16384 \
    --scenes pyramid_40,many_pyramids,tumbler,capsules,card_house --storages vla --out "$out/sim_suite" 2>&1 | tail -8
timeout 120 python run.py bench profile --scene pyramid_100 --storages vla --warmup 100 --steps 10 --arch cuda 2>&1 \
    | grep "ms/step"
fi
if part pile; then
echo "== pile_1m moving and settling, sleeping on and off"
timeout 200 python run.py bench sim --arch cuda --steps 30 --scenes pile_1m --storages vla --out "$out/sim_pile_1m_moving" \
    2>&1 | tail -4
timeout 380 python run.py bench sim --arch cuda --steps 30 --warmup 2600 --scenes pile_1m \
    --storages "vla,vla+sim.sleep_speed=0" --out "$out/sim_pile_1m_settling" 2>&1 | tail -6
fi
if part viewer; then
echo "== bench viewer"
for scene in default pile_100k pile_1m; do
  frames=120; [ $scene = pile_100k ] && frames=60; [ $scene = pile_1m ] && frames=30
  timeout 150 python run.py bench viewer --arch cuda --scene scenes/$scene.yaml --frames $frames --warmup 10 \
      --out "$out/viewer_$scene" 2>&1 | tail -7
done
fi
if part batch; then
echo "== bench batch"
timeout 120 python run.py bench batch --arch cuda --scene scenes/default.yaml --runs 2 --frames 30 --workers 1,2 \
    --json "$out/batch.json" 2>&1 | tail -8
echo "== bench repro: three runs of default.yaml in one process, bit for bit (exit 1 when they differ)"
timeout 200 python run.py bench repro --arch cuda --steps 300 --out "$out/repro" 2>&1 | tail -8
echo "== bench filter"
timeout 120 python run.py bench filter --arch cuda --no-scipy --out "$out/filter" 2>&1 | tail -12
timeout 120 python run.py bench filter --arch cuda --map random --no-scipy --out "$out/filter_random" 2>&1 | tail -12
fi

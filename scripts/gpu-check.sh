#!/bin/bash
# The GPU checks of the README ("On a real GPU", "Training on a GPU"), as they run on a lent
# NVIDIA machine (the `device` tool: one command at most 10 minutes, the machine kept while
# calls follow each other closely).
#
# Prepare on a build machine, in the repository root:
#   cargo build --release --features wgpu --bin marshal
#   cargo test --release -p marshal-telemetry --test nvml --no-run   # prints the test binary
#   cargo bench -p marshal-telemetry --bench sink --no-run           # prints the bench binary
#   mkdir -p .gpu-run/bin .gl
#   strip -o .gpu-run/bin/marshal target/release/marshal && xz .gpu-run/bin/marshal
#   strip -o .gpu-run/bin/nvml-test target/release/deps/nvml-<hash> && xz .gpu-run/bin/nvml-test
#   strip -o .gpu-run/bin/sink-bench target/release/deps/sink-<hash> && xz .gpu-run/bin/sink-bench
#   for d in T/*; do mkdir -p .gpu-run/T/$(basename $d); cp -r $d/kind=step .gpu-run/T/$(basename $d)/; done
#   (cd .gl && apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0)
# where T/ holds the six simulated recordings of the README's predictor section.
#
# Then on the GPU machine, from the repository root:
#   OUT=DIR bash scripts/gpu-check.sh start     # checks, then both training runs detached
#   OUT=DIR bash scripts/gpu-check.sh collect   # waits for the runs (call again if needed)
# `start` leaves the two `marshal train predictor` runs (wgpu and one CPU thread, side by
# side) in their own sessions so they outlive the command; `collect` waits up to WAIT_S
# seconds (default 560) for both and copies every log into $OUT either way. The machine
# goes back about 30 s after a call ends, taking the detached runs with it: `collect` must
# follow `start` at once (on 2026-11-24 it did not, and found a fresh machine).
# MAX_EPOCHS (default 60) caps every network of the runs; at 60 the GPU run did not finish
# inside one call (2026-11-24: more than 470 s), so for a whole run timed in one call use
#   MAX_EPOCHS=15 WAIT_S=420 OUT=DIR bash scripts/gpu-check.sh start
# (both runs take the same cap, so the GPU and CPU times stay comparable).
set -u
OUT=${OUT:?set OUT to a directory for the logs}
PHASE=${1:-start}
WAIT_S=${WAIT_S:-560}
MAX_EPOCHS=${MAX_EPOCHS:-60}
B=/tmp/bin
LOGS=/tmp/gpu-logs

copy_logs() {
    cp "$LOGS"/*.log "$LOGS"/*.txt "$OUT"/ 2>/dev/null
    return 0
}

wait_for_runs() {
    local deadline=$((SECONDS + WAIT_S))
    while ((SECONDS < deadline)); do
        [[ -e $LOGS/train-gpu.done && -e $LOGS/train-cpu.done ]] && break
        sleep 5
    done
    for run in gpu cpu; do
        if [[ -e $LOGS/train-$run.done ]]; then
            echo "train $run: $(cat "$LOGS/train-$run.done")"
        else
            echo "train $run: still running"
        fi
    done
    copy_logs
}

if [[ $PHASE == collect ]]; then
    wait_for_runs
    exit 0
fi

mkdir -p $B /tmp/tele $LOGS
for f in .gpu-run/bin/*.xz; do xz -dc "$f" > $B/"$(basename "$f" .xz)"; done
chmod +x $B/*
# The NVIDIA Vulkan ICD needs the glvnd dispatch library; without it wgpu finds no adapter.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv
nproc
grep -m1 'model name' /proc/cpuinfo

# One training run, detached: wall seconds and exit status land in train-NAME.done.
start_training() {
    local name=$1 device=$2
    local args
    args="$(printf -- '--telemetry %s ' .gpu-run/T/*)--cluster dgx-h100-64 --max-epochs $MAX_EPOCHS"
    setsid nohup bash -c "
        start=\$(date +%s%N)
        $B/marshal train predictor $args --device $device --out /tmp/m-$name > $LOGS/train-$name.log 2>&1
        status=\$?
        end=\$(date +%s%N)
        echo \"exit \$status, wall \$(( (end - start) / 1000000 )) ms\" > $LOGS/train-$name.done
    " > /dev/null 2>&1 < /dev/null &
}

$B/marshal agent --source nvml --interval 1s --out /tmp/tele > "$LOGS/agent.log" 2>&1 &
AGENT=$!
start_training gpu wgpu
start_training cpu cpu
setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,clocks.sm,memory.used \
    --format=csv -l 10 > "$LOGS/nvidia-smi.log" 2>&1 < /dev/null &

$B/nvml-test --test-threads 1 2>&1 | tee "$LOGS/nvml-test.log"
$B/marshal telemetry topology 2>&1 | tee "$LOGS/topology.txt"
SINK_BENCH_REPORT_ONLY=1 SINK_BENCH_ONLY=batch_core_128_rows_per_msg taskset -c $(($(nproc) - 1)) \
    $B/sink-bench --bench 2>&1 | tee "$LOGS/sink-bench.log"

sleep 45
kill -INT $AGENT
wait $AGENT
echo "agent exit $?"
find /tmp/tele -name '*.tmp' # nothing: the last file was finalised
$B/marshal telemetry inspect /tmp/tele 2>&1 | tee "$LOGS/inspect.txt"
tar czf "$OUT/nvml-telemetry.tar.gz" -C /tmp tele
wait_for_runs

#!/bin/bash
# The GPU checks of the README ("On a real GPU", "Training on a GPU"), as they ran on an
# NVIDIA H100 on 2026-11-23 (two runs of this script's parts; merged here).
#
# Prepare on a build machine, in the repository root:
#   cargo build --release --features wgpu
#   cargo test -p marshal-telemetry --test nvml --no-run   # prints the test binary's path
#   mkdir -p .gpu-run/bin .gl
#   strip -o .gpu-run/bin/marshal target/release/marshal && xz .gpu-run/bin/marshal
#   strip -o .gpu-run/bin/nvml-test target/debug/deps/nvml-<hash> && xz .gpu-run/bin/nvml-test
#   for d in T/*; do mkdir -p .gpu-run/T/$(basename $d); cp -r $d/kind=step .gpu-run/T/$(basename $d)/; done
#   (cd .gl && apt-get download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0)
# where T/ holds the six simulated recordings of the README's predictor section. Then,
# on the GPU machine, from the repository root: OUT=DIR bash scripts/gpu-check.sh
set -u
OUT=${OUT:?set OUT to a directory for the logs}
mkdir -p /tmp/bin /tmp/tele
for f in .gpu-run/bin/*.xz; do xz -dc "$f" > /tmp/bin/"$(basename "$f" .xz)"; done
chmod +x /tmp/bin/*
B=/tmp/bin
# The NVIDIA Vulkan ICD needs the glvnd dispatch library; without it wgpu finds no adapter.
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv
$B/nvml-test --test-threads 1
$B/marshal telemetry topology | tee "$OUT/topology.json"

TRAIN="$(for d in .gpu-run/T/*; do echo --telemetry "$d"; done) --cluster dgx-h100-64 --max-epochs 60"
$B/marshal agent --source nvml --interval 1s --out /tmp/tele > "$OUT/agent.log" 2>&1 &
AGENT=$!
# shellcheck disable=SC2086
timeout 480 $B/marshal train predictor $TRAIN --device wgpu --out /tmp/m-gpu > "$OUT/train-gpu.log" 2>&1 &
GPU=$!
# shellcheck disable=SC2086
timeout 480 $B/marshal train predictor $TRAIN --device cpu --out /tmp/m-cpu > "$OUT/train-cpu.log" 2>&1 &
CPU=$!
sleep 30
nvidia-smi --query-gpu=utilization.gpu,power.draw,clocks.sm,memory.used --format=csv
sleep 32
kill -INT $AGENT; wait $AGENT; echo "agent exit $?"
find /tmp/tele -name '*.tmp'   # nothing: the last file was finalised
$B/marshal telemetry inspect /tmp/tele | tee "$OUT/inspect.txt"
tar czf "$OUT/nvml-telemetry.tar.gz" -C /tmp tele
wait $GPU; echo "gpu train exit $?"
wait $CPU; echo "cpu train exit $?"

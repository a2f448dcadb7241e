#!/bin/sh
# Boot the carried Debian root under real systemd on the GPU machine and run
# the scenarios inside it as a boot-time unit.  On the device machine
# (one GPU or more), with .gpucarry built by tests/gpu/systemd/build-carry:
#     cd .gpucarry && sh boot-scenarios.sh
# Results land in $OUT (default ./out): results.json, scenarios.log,
# console.log (the container's console), launcher.log.
# IU_SCENARIOS="s6 s7" runs only those scenarios.
# IU_LLAMA_DIR=DIR (bin/llama-server, model.gguf, CONTEXT: tools/engines/
# build-llama-cuda on the machine; here the CPU build of tools/engines/build)
# adds llama.cpp as the models' server: scenarios l1-l8 (else they are skipped).
# IU_FAKE_GPUS=1 runs the same on a machine without GPUs (fake GPU table;
# tests/gpu/systemd/run-local).
#
# The container's systemd never sees the machine's root cgroup: this shell
# moves into its own cgroup first, and the container starts inside
# `unshare --cgroup` (a try without it left the machine unresponsive).
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out}
W=${IU_WORK:-/var/tmp/iu-gpu}
FAKE=${IU_FAKE_GPUS:-}
LIMIT=${IU_TIME_LIMIT:-420}          # the whole boot and scenarios, seconds
CG=/sys/fs/cgroup
V2=""
[ "$(stat -fc %T $CG)" = cgroup2fs ] && V2=1
LLAMA=${IU_LLAMA_DIR:-}
export HERE OUT W FAKE V2 LLAMA
mkdir -p "$OUT"

say() { echo "boot-scenarios: $(date -u +%H:%M:%S.%N | cut -c1-12) $*"; }

host_python() {
    if [ -x /opt/torch/.venv/bin/python3 ]; then echo /opt/torch/.venv/bin/python3; else echo python3; fi
}

prepare_root() {            # $1: the container root
    C=$1
    mkdir -p "$C/opt/iu-gpu" "$C/hs" "$C/out"
    cp "$HERE/scenarios.py" "$HERE/server.py" "$C/opt/iu-gpu/"
    cp -r "$HERE/bench-tree" "$C/opt/iu-gpu/bench-tree"      # s8: the restart bench
    install -m 0755 "$HERE/host-python" "$C/usr/local/bin/host-python"
    cat > "$C/opt/iu-gpu/host-mounts" <<'SH'
#!/bin/sh
# The machine's root for host-python: its /usr /opt /etc (nspawn binds) plus
# this container's API file systems, /tmp and /run.
set -eu
mkdir -p /run/iu-gpu/py/sglang /run/iu-metrics
cp /opt/iu-gpu/server.py /run/iu-gpu/server.py
: > /run/iu-gpu/py/sglang/__init__.py
cat > /run/iu-gpu/py/sglang/launch_server.py <<'PY'
# Stand-in for SGLang's entry point: the harness's CUDA TP server.
import sys
sys.path.insert(0, "/run/iu-gpu")
import server
if __name__ == "__main__":
    sys.exit(server.main())
PY
if [ -d /host/usr/bin ]; then
    for d in dev proc sys tmp run; do
        mkdir -p /host/$d
        mountpoint -q /host/$d || mount --rbind /$d /host/$d
    done
fi
SH
    chmod 0755 "$C/opt/iu-gpu/host-mounts"
    cat > "$C/usr/local/bin/iu-llama-server" <<'SH'
#!/bin/sh
# llama-server as the GPU machine built it (IU_LLAMA_DIR, bound at
# /run/iu-llama by inner.sh), run in the machine's root (/host) as host-python
# runs its torch: the machine's CUDA libraries and driver.  The process stays
# in the unit's cgroup and the container's PID namespace.  With fake GPUs (the
# local run) it holds the fake device file of each GPU in CUDA_VISIBLE_DEVICES
# open: that is how the fake backend sees a GPU user.
set -eu
if [ -f /opt/iu-gpu/host.env ]; then . /opt/iu-gpu/host.env; fi
if [ "${IU_FAKE_GPUS:-}" = 1 ]; then
    fd=7
    for i in $(echo "${CUDA_VISIBLE_DEVICES:-}" | tr , ' '); do
        eval "exec $fd</var/lib/fakegpu/nvidia$i"
        fd=$((fd + 1))
    done
fi
exec /usr/sbin/chroot /host /run/iu-llama/bin/llama-server "$@"
SH
    chmod 0755 "$C/usr/local/bin/iu-llama-server"
    # The machine's root as host-python and iu-llama-server see it: its
    # merged-/usr links (its /usr /opt /etc: inner.sh).
    mkdir -p "$C/host/usr" "$C/host/opt" "$C/host/etc"
    for l in bin sbin lib lib32 lib64 libx32; do
        if [ -L "/$l" ]; then ln -sfn "$(readlink "/$l")" "$C/host/$l"; fi
    done
    cat > "$C/etc/systemd/system/iu-host-mounts.service" <<'UNIT'
[Unit]
Description=host-python's view of the GPU machine
DefaultDependencies=no
After=local-fs.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/iu-gpu/host-mounts
UNIT
    cat > "$C/etc/systemd/system/iu-gpu-scenarios.service" <<UNIT
[Unit]
Description=infer-units GPU scenarios (results in /out)
Requires=iu-host-mounts.service
After=iu-host-mounts.service dbus.service basic.target
SuccessAction=poweroff
FailureAction=poweroff
[Service]
Type=exec
Environment=PYTHONUNBUFFERED=1 IU_FAKE_GPUS=$FAKE "IU_SCENARIOS=${IU_SCENARIOS:-}"
ExecStart=/usr/bin/python3 /opt/iu-gpu/scenarios.py /out /hs
TimeoutStartSec=infinity
ExecStopPost=/bin/sh -c 'journalctl -b --no-pager -o short-monotonic > /out/journal.txt'
StandardOutput=journal+console
StandardError=journal+console
[Install]
WantedBy=multi-user.target
UNIT
    mkdir -p "$C/etc/systemd/system/multi-user.target.wants"
    ln -sf ../iu-gpu-scenarios.service "$C/etc/systemd/system/multi-user.target.wants/"
    mkdir -p "$C/etc/infer-units/defaults.toml.d"
    # Every model's hooks write the textfile collector's metrics here.
    printf '[env]\nINFER_UNITS_METRICS_DIR = "/run/iu-metrics"\n' \
        > "$C/etc/infer-units/defaults.toml.d/50-harness.toml"
    if [ -n "$FAKE" ]; then
        mkdir -p "$C/var/lib/fakegpu"
        : > "$C/var/lib/fakegpu/nvidia0"
        : > "$C/var/lib/fakegpu/nvidia1"
        : > "$C/var/lib/fakegpu/nvidiactl"     # no GPU's: l7's GPU monitor holds it
        # IU_FAKE_GPU_COUNT=1: the one-GPU machine's path (two-GPU scenarios skipped)
        gpu0='{"index": 0, "uuid": "GPU-fake0000-0000-0000-0000-000000000000", "pci": "0000:41:00.0", "device": "/var/lib/fakegpu/nvidia0", "memory_mib": 143771, "memory_used_mib": 0}'
        gpu1='{"index": 1, "uuid": "GPU-fake0001-0000-0000-0000-000000000001", "pci": "0000:42:00.0", "device": "/var/lib/fakegpu/nvidia1", "memory_mib": 143771, "memory_used_mib": 0}'
        if [ "${IU_FAKE_GPU_COUNT:-2}" = 1 ]; then
            printf '{"gpus": [%s]}\n' "$gpu0"
        else
            printf '{"gpus": [%s, %s]}\n' "$gpu0" "$gpu1"
        fi > "$C/etc/infer-units/fakegpus.json"
        # the hooks honour INFER_UNITS_FAKE_GPUS from [env] only on a host so marked
        echo "test host" > "$C/etc/infer-units/hooks-test-mode"
        printf 'INFER_UNITS_FAKE_GPUS = "/etc/infer-units/fakegpus.json"\nIU_FAKE_GPUS = "1"\n' \
            >> "$C/etc/infer-units/defaults.toml.d/50-harness.toml"
    else
        # NVML for the hooks inside (the bundled pynvml loads libnvidia-ml.so.1).
        nvml=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
        [ -n "$nvml" ] || nvml=$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 2>/dev/null)
        say "libnvidia-ml: $nvml -> $(readlink -f "$nvml")"
        cp -L "$nvml" "$C/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" && chroot "$C" /sbin/ldconfig
        # The library paths this command runs with (the machine's CUDA setup),
        # for host-python: units start with a clean environment.
        for v in LD_LIBRARY_PATH CUDA_HOME; do
            eval "val=\${$v:-}"
            [ -n "$val" ] && printf "export %s='%s'\n" "$v" "$val"
        done > "$C/opt/iu-gpu/host.env"
        say "host.env: $(cat "$C/opt/iu-gpu/host.env" | tr '\n' ' ')"
    fi
}

outer_watch() {             # scenario 7: a CUDA process outside the container
    if [ -n "$V2" ]; then mkdir -p $CG/iu-gpu-outer && echo 0 > $CG/iu-gpu-outer/cgroup.procs; fi
    while [ ! -e "$W/hs/request-outer" ]; do
        [ -e "$W/hs/finished" ] && return 0
        sleep 0.2
    done
    say "outer holder: starting on GPU 0 (request: $(cat "$W/hs/request-outer"))"
    CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID IU_FAKE_GPUS="$FAKE" \
        "$(host_python)" "$HERE/outer-holder.py" "$(cat "$W/hs/request-outer")" \
        "$W/hs/outer-ready" "$W/hs/release-outer" "$W/t/c/var/lib/fakegpu/nvidia0"
    say "outer holder: exited $?"
}

main() {
    say "start; fake=${FAKE:-no} cgroup2=${V2:-no} llama=${LLAMA:-no} $(uname -r)"
    if [ -n "$LLAMA" ] && [ ! -x "$LLAMA/bin/llama-server" ]; then
        say "IU_LLAMA_DIR=$LLAMA has no bin/llama-server"; return 1
    fi
    if [ -z "$FAKE" ]; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv
        ls -l /dev/nvidia* 2>&1
    fi
    rm -rf "$W" && mkdir -p "$W/t" "$W/hs"
    t0=$(date +%s.%N)
    xz -T0 -dc "$HERE/root.tar.xz" > "$W/root.tar" || { say "cannot unpack root.tar.xz"; return 1; }
    tar -C "$W/t" -xf "$W/root.tar" && mkdir -p "$W/t/c" && tar -C "$W/t/c" -xf "$W/root.tar"
    rm -f "$W/root.tar"
    say "unpacked twice in $(awk "BEGIN{print $(date +%s.%N) - $t0}") s: $(du -sh "$W/t" | cut -f1)"
    prepare_root "$W/t/c"
    outer_watch > "$W/outer.log" 2>&1 &
    watcher=$!
    if [ -n "$V2" ]; then
        mkdir -p $CG/iu-gpu
        echo 0 > $CG/iu-gpu/cgroup.procs || { say "cannot move into $CG/iu-gpu"; return 1; }
        say "in cgroup $(cat /proc/self/cgroup)"
    fi
    say "booting (limit ${LIMIT}s)"
    timeout -k 15 "$LIMIT" unshare --mount --cgroup --pid --fork --kill-child sh "$HERE/inner.sh"
    rc=$?
    say "container exited $rc"
    : > "$W/hs/finished"
    [ -e "$W/hs/release-outer" ] || : > "$W/hs/release-outer"
    wait "$watcher"
    cat "$W/outer.log"
    if [ -n "$V2" ]; then
        echo 0 > $CG/cgroup.procs 2>/dev/null || true
        for g in iu-gpu iu-gpu-outer; do
            [ -d $CG/$g ] || continue
            [ -e $CG/$g/cgroup.kill ] && echo 1 > $CG/$g/cgroup.kill
            sleep 0.5
            find $CG/$g -depth -type d -exec rmdir {} + 2>/dev/null || say "cgroup $g left: $(cat $CG/$g/cgroup.procs 2>/dev/null | tr '\n' ' ')"
        done
    fi
    if [ -z "$FAKE" ]; then
        nvidia-smi --query-gpu=index,memory.used --format=csv
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv
    fi
    [ -f "$OUT/results.json" ] || { say "no results.json; the console's end:"; tail -40 "$OUT/console.log"; }
    python3 - "$OUT/results.json" <<'PY' || true
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no results: {e}"); sys.exit(0)
for name, s in r.get("scenarios", {}).items():
    verdict = "SKIP" if s.get("skipped") else "PASS" if s.get("ok") else "FAIL"
    print(f"{name}: {verdict} {s.get('skipped') or s.get('summary', s.get('error', ''))}")
PY
    return $rc
}

main 2>&1 | tee "$OUT/launcher.log"

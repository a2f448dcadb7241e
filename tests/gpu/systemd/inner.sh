#!/bin/sh
# Inside `unshare --mount --cgroup --pid --fork` (boot-scenarios.sh): PID 1 of a new
# PID namespace whose cgroup namespace is rooted at the harness's own cgroup.
# Builds the tools root's mounts, chroots, and boots the container root (/c)
# with systemd-nspawn, every /dev/nvidia* node passed in.
set -eu
T=$W/t
mount --make-rprivate /
mount --bind "$T" "$T"
mount -t proc proc "$T/proc"
mount -t sysfs sysfs "$T/sys"
if [ -n "$V2" ]; then
    mount -t cgroup2 cgroup2 "$T/sys/fs/cgroup"     # rooted at our cgroup (namespace)
else
    mount --rbind /sys/fs/cgroup "$T/sys/fs/cgroup"   # hybrid hosts (the local run)
fi
mount -t tmpfs tmpfs "$T/run"
mount -t tmpfs tmpfs "$T/tmp"
mount --rbind /dev "$T/dev"
mkdir -p "$T/out" "$T/hs"
mount --bind "$OUT" "$T/out"
mount --bind "$W/hs" "$T/hs"
set -- --bind=/out --bind=/hs
# The machine's root for host-python and iu-llama-server (with fake GPUs too:
# the local run's llama-server is this machine's build).
# --rbind: /usr/local/nvidia is a mount of its own (without it CUDA finds no driver).
for d in usr opt etc; do
    mkdir -p "$T/host/$d"
    mount --rbind "/$d" "$T/host/$d"
    set -- "$@" "--bind-ro=/host/$d:/host/$d"
done
if [ -n "$LLAMA" ]; then
    # Under /run: the container's /run is bound into /host as well, so the
    # server's and the model's path is the same on both sides of the chroot.
    mkdir -p "$T/llama"
    mount --bind "$LLAMA" "$T/llama"
    set -- "$@" "--bind-ro=/llama:/run/iu-llama"
fi
if [ -z "$FAKE" ]; then
    for dev in /dev/nvidia*; do
        set -- "$@" "--bind=$dev"
    done
fi
echo "inner: nspawn $*"
chroot "$T" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SYSTEMD_NSPAWN_TMPFS_TMP=0 \
    /usr/bin/systemd-nspawn -D /c -b --register=no --keep-unit -q "$@" \
    > "$OUT/console.log" 2>&1

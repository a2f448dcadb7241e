"""The real engines (vLLM's CPU build, llama.cpp's llama-server) inside the e2e
containers, for tests/e2e/test_real_engines.py and bench/real_engines_bench.py.

The engines are built on the host by tools/engines/build into
/var/cache/infer-units-engines (built when missing, so a fresh machine builds
them here, minutes; a warm one finds them) and bound read-only into the
container at the same path.  llama-server is a static binary and runs as is
(libgomp1 from the suite).  vLLM's venv is built on the host's Debian Python
3.11: a suite with that Python (bookworm) runs the venv's interpreter
directly, as an operator's model file would; a suite with another one
(trixie: 3.13) runs it through iu-host-python, a chroot into the host's /usr
and /etc bound under /host with the container's /dev, /proc, /sys, /tmp and
/run: the server stays in the unit's cgroup and the container's PID and
network namespaces.  The engines' OS packages (libnuma1, g++, python3-dev:
vLLM compiles at warm-up; libgomp1) are installed in every suite with apt.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .container import Container
from .e2e_support import FAKE_TABLE, install_fake_gpus, wait_until

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools/engines/build"
OS_PACKAGES = "libnuma1 g++ python3-dev libgomp1 procps"
HOST_PYTHON = "/usr/local/bin/iu-host-python"
POLLER = "/usr/local/bin/iu-first-2xx"
# CPU-only vLLM on this machine: a fixed KV cache (it refuses to start when
# 92% of a NUMA node is not free) and a short context.
VLLM_ARGS = ["--kv-cache-memory-bytes", "268435456", "--max-model-len", "512"]
# How long a real start may take on a busy 2-core machine (vLLM: ~40 s idle;
# over 300 s seen with three vLLM containers and other work on the 2 cores).
LOAD_TIMEOUT = float(os.environ.get("INFER_UNITS_REAL_LOAD_TIMEOUT", "900"))


def engine_paths() -> dict[str, str]:
    """Build what is missing (nice: the machine is shared), then the paths."""
    done = subprocess.run(["nice", "-n", "10", str(BUILD), "all"], capture_output=True,
                          text=True, timeout=4800)
    assert done.returncode == 0, f"tools/engines/build all:\n{done.stderr[-6000:]}"
    done = subprocess.run([str(BUILD), "--print-paths"], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def host_python_version(paths: dict[str, str]) -> str:
    return subprocess.run([paths["vllm_python"], "-c",
                           "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


WRAPPER = """#!/bin/sh
# vLLM's venv (built on the host's Python {version}) run from this suite, whose
# python3 is another: chroot into the host's /usr and /etc under /host.  The
# process stays in the unit's cgroup and this container's namespaces.
exec /usr/sbin/chroot /host /usr/bin/env HOME=/tmp {python} "$@"
"""

POLL = """#!/usr/bin/python3
# iu-first-2xx URL FILE: poll URL every 20 ms; at the first 2xx write two
# CLOCK_MONOTONIC times (the clock of systemd's *TimestampMonotonic) to FILE
# and exit: when that 2xx came back, and when the last request was sent that
# the server answered "not ready" (connection refused, or a status that is
# not 2xx).  The server's first 2xx lies between the two; a poller cannot
# see it closer (the unit's own probe may well get it first).  Once it has
# seen "not ready" it touches FILE.polling: the test starts the unit only
# then, so a poller slow to start on a busy machine cannot miss the window.
import errno, os, sys, time, urllib.error, urllib.request
url, out = sys.argv[1], sys.argv[2]
not_ready = 0.0
while True:
    if not_ready and not os.path.exists(out + ".polling"):
        open(out + ".polling", "w").close()
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if 200 <= r.status < 300:
                t = time.monotonic()
                with open(out + ".tmp", "w") as f:
                    f.write("%.6f %.6f\\n" % (t, not_ready))
                os.replace(out + ".tmp", out)
                sys.exit(0)
            not_ready = sent
    except urllib.error.HTTPError:
        not_ready = sent
    except urllib.error.URLError as e:
        if getattr(e.reason, "errno", None) == errno.ECONNREFUSED:
            not_ready = sent
    except Exception:
        pass        # a timeout or a reset says nothing of when the server was ready
    time.sleep(0.02)
"""


class RealBox:
    """A booted container with the .deb, the engines' OS packages and the
    engine caches; `vllm_python` is what a model file's `python` names."""

    def __init__(self, suite: str, paths: dict[str, str]) -> None:
        self.paths = paths
        cache = paths["cache"]
        binds = [f"--bind-ro={cache}"]
        self.via_chroot = False
        self.suite = suite
        self.c = Container(suite, nspawn_args=tuple(binds))

    def boot(self, deb: Path) -> None:
        c = self.c
        c.boot()
        version = host_python_version(self.paths)
        inside = c.sh("python3 -c \"import sys; print('%d.%d' % sys.version_info[:2])\"").stdout.strip()
        self.via_chroot = inside != version
        if self.via_chroot:
            # nspawn's binds are fixed at boot: boot again with the host's tree.
            c._stop()
            cache = self.paths["cache"]
            c.nspawn_args += ["--bind-ro=/usr:/host/usr", "--bind-ro=/etc:/host/etc",
                              f"--bind-ro={cache}:/host{cache}"]
            host = c.path("/host")
            host.mkdir(exist_ok=True)
            for link in ("bin", "lib", "lib64", "sbin"):
                if not (host / link).is_symlink():
                    (host / link).symlink_to(f"usr/{link}")
            for d in ("dev", "proc", "sys", "tmp", "run", "var/cache"):
                (host / d).mkdir(parents=True, exist_ok=True)
            c._start()
            # The container's own /dev (with /dev/shm: vLLM's queues), /proc, ...
            c.write("/etc/systemd/system/iu-host-mounts.service", HOST_MOUNTS)
            c.sh("systemctl daemon-reload && systemctl enable --now iu-host-mounts.service")
            c.write(HOST_PYTHON, WRAPPER.format(version=version, python=self.paths["vllm_python"]),
                    mode=0o755)
            self.vllm_python = HOST_PYTHON
        else:
            self.vllm_python = self.paths["vllm_python"]
        c.write(POLLER, POLL, mode=0o755)
        install_fake_gpus(c)
        c.sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
             f"--no-install-recommends {OS_PACKAGES}", timeout=1800, net=True)
        done = c.install_deb(deb)
        assert done.returncode == 0, done.stderr

    def shutdown(self) -> None:
        self.c.shutdown()

    # ------------------------------------------------------------ model files
    def vllm_toml(self, port: int, gpus: list[int], *, liveness: str = "", extra: str = "",
                  args: list[str] = VLLM_ARGS) -> str:
        return _toml({"engine": "vllm", "model": self.paths["hf_model"],
                      "python": self.vllm_python, "gpus": gpus, "port": port,
                      "args": args}, liveness=liveness, extra=extra,
                     env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})

    def llama_toml(self, port: int, gpus: list[int], *, liveness: str = "", extra: str = "",
                   model: str | None = None, args: tuple[str, ...] = ()) -> str:
        return _toml({"engine": "llamacpp", "model": model or self.paths["gguf_model"],
                      "executable": self.paths["llama_server"], "gpus": gpus, "port": port,
                      "args": ["--threads", "1", *args]}, liveness=liveness, extra=extra, env={})

    def add(self, name: str, text: str) -> None:
        self.c.write(f"/etc/infer-units/{name}.toml", text)
        self.c.sh("systemctl daemon-reload")


HOST_MOUNTS = """[Unit]
Description=the container's /dev /proc /sys /tmp /run under /host (iu-host-python's chroot)
DefaultDependencies=no
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for d in dev proc sys tmp run; do mountpoint -q /host/$d || mount --rbind /$d /host/$d; done'

[Install]
WantedBy=multi-user.target
"""


def _toml(top: dict, *, liveness: str, extra: str, env: dict[str, str]) -> str:
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    lines += ["", "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in env.items()]
    lines += ["", "[ready]", f'timeout = "{int(LOAD_TIMEOUT)}s"', 'interval = "200ms"',
              "", "[reap]", 'term-grace = "2s"', 'timeout = "30s"',
              "", "[liveness]", liveness or 'interval = "0"',
              "", "[service]", 'RestartSec = "1s"', extra]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ reading

def props(c: Container, unit: str, *names: str) -> dict[str, str]:
    out = c.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in names)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def state(c: Container, unit: str) -> str:
    return props(c, unit, "ActiveState")["ActiveState"]


def main_pid(c: Container, unit: str) -> int:
    return int(props(c, unit, "MainPID")["MainPID"])


def monotonic(c: Container, unit: str, prop: str) -> float:
    return int(props(c, unit, prop)[prop]) / 1e6


# pid, ppid and comm of every process in the container
TREE = r"""python3 -c '
import os
for p in os.listdir("/proc"):
    try:
        s = open("/proc/%s/stat" % p).read()
        c = open("/proc/%s/comm" % p).read().strip()
        print(p, s.rsplit(")", 1)[1].split()[1], c)
    except (OSError, ValueError, IndexError):
        pass
'"""


def tree(c: Container, unit: str) -> dict[int, str]:
    """The unit's main process and its descendants, pid -> comm (read from
    /proc: the cgroup layout differs between hosts with cgroup v1 and v2)."""
    root = main_pid(c, unit)
    if not root:
        return {}
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for row in c.sh(TREE).stdout.splitlines():
        parts = row.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
            names[int(parts[0])] = parts[2]
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in names and pid not in out:
            out[pid] = names[pid]
            todo += children.get(pid, [])
    return out


def unit_pids(c: Container, unit: str) -> list[int]:
    """Every process left in the unit's cgroup (cgroup v2, or v1's name=systemd)."""
    cg = props(c, unit, "ControlGroup")["ControlGroup"]
    if not cg:
        return []
    out = c.sh(f"cat /sys/fs/cgroup{cg}/cgroup.procs /sys/fs/cgroup/systemd{cg}/cgroup.procs "
               "2>/dev/null || true").stdout
    return sorted({int(p) for p in out.split()})


def engine_core(c: Container, unit: str) -> int:
    """vLLM's EngineCore process (its title VLLM::EngineCore; comm is cut at 15)."""
    for pid, name in tree(c, unit).items():
        if name.startswith("VLLM::EngineCor"):
            return pid
    return 0


def wait_for(predicate, timeout: float, step: float = 0.2) -> bool:
    """support.wait_until (the tests' one wait), polling at most every `step`."""
    return wait_until(predicate, timeout, step=min(step, 0.05), max_step=step)


def start_poller(c: Container, name: str, port: int, path: str = "/health") -> str:
    """A poller of the server's URL from inside the container (its network
    namespace): the file it writes holds the monotonic time of the first 2xx."""
    out = f"/run/iu-first-2xx-{name}"
    # The last poller stopped before its files go: a live one would write them anew.
    c.sh(f"systemctl stop iu-poll-{name} 2>/dev/null; "
         f"systemctl reset-failed iu-poll-{name} 2>/dev/null; rm -f {out} {out}.polling; "
         f"systemd-run --quiet --unit=iu-poll-{name} -p RuntimeMaxSec={int(LOAD_TIMEOUT) + 300} "
         f"{POLLER} http://127.0.0.1:{port}{path} {out}")
    # The poller must have seen the server not ready (refused: nothing listens
    # yet) before the unit starts, or it may first look after the server's 2xx.
    assert wait_for(lambda: c.sh(f"test -e {out}.polling", check=False).returncode == 0, 60), \
        f"the poller of {name} never saw port {port} not ready before the start"
    return out


def first_2xx(c: Container, out: str, timeout: float = 30) -> tuple[float, float]:
    """(when the poller's first 2xx came back, when it last sent a request
    that the server answered "not ready"): the server's first 2xx lies between."""
    assert wait_for(lambda: c.sh(f"test -s {out}", check=False).returncode == 0, timeout), \
        f"no 2xx recorded in {out}"
    first, not_ready = c.sh(f"cat {out}").stdout.split()
    return float(first), float(not_ready)


def generate(c: Container, port: int, model: str, prompt: str = "Hello") -> dict:
    """One token through the engine's OpenAI-style completions API."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    out = c.sh("python3 -c 'import sys, urllib.request; "
               f"r = urllib.request.urlopen(urllib.request.Request(\"http://127.0.0.1:{port}/v1/completions\", "
               "data=sys.argv[1].encode(), headers={\"Content-Type\": \"application/json\"}), timeout=60); "
               f"print(r.read().decode())' '{body}'").stdout
    return json.loads(out)


def completion_status(c: Container, port: int, body: dict) -> int:
    """The HTTP status of one POST /v1/completions with `body`."""
    out = c.sh("python3 -c 'import sys, urllib.request, urllib.error\n"
               "try:\n"
               f" r = urllib.request.urlopen(urllib.request.Request(\"http://127.0.0.1:{port}/v1/completions\", "
               "data=sys.argv[1].encode(), headers={\"Content-Type\": \"application/json\"}), timeout=60)\n"
               " print(r.status)\n"
               "except urllib.error.HTTPError as e:\n"
               " print(e.code)' " + "'" + json.dumps(body) + "'").stdout
    return int(out.strip())

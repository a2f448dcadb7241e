#!/usr/bin/python3
"""What `infer-units wait-ready` costs while a server loads, and how late it
notices the server is ready.

    /usr/bin/python3 bench/ready_bench.py [--tree DIR] [--wait 10] [--runs 7] [--sockets 2000]

`--tree` runs the hook of another checkout (e.g. a worktree of the previous
commit) for a side-by-side figure; default: this checkout.  The server is
a thread of this process, so the hook's CPU (its own rusage, from wait4) is
the hook's alone.  Scenarios, each `--wait` seconds of waiting:

  absent     nothing on the port (a server still importing)
  bound      bound, not listening (vLLM holds its port so ~25 s)
  loading    listening, /health 503 "Loading model" (llama.cpp)

CPU per 10 s of waiting: the hook's own CPU time (the kernel's
sum_exec_runtime of its threads, /proc/PID/task/*/schedstat, in ns) read
1.5 s after it started and again --wait seconds later, so neither the
interpreter's start nor the first second's faster polls are in it; median of
3.  (Not a run of 1 s + --wait minus a run of 1 s: two interpreter
starts' noise would swamp a figure of a few ms.)  "absent, first second in": the same
from the hook's first look at the port (its first "waiting for" line), so
the first second's faster polls count, spread over --wait.  Lag: the hook's
exit minus the moment the server could first answer 2xx (vLLM: it starts
listening; llama.cpp: /health turns 200), median and max of --runs, the
server ready from 1 s after the hook is started on (0.137 s later each run),
and for "bound" also 0.4-0.9 s after it (a small model or a restart: the
first second's polls).  The goals (docs/performance.md): under 1% of one
core (0.1 s per 10 s), the unit active within 100 ms of the first 2xx.
"""

from __future__ import annotations

import argparse
import http.server
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A health endpoint whose answer flips to 200 at `ready_at` (monotonic)."""

    def __init__(self, port: int, listen_at: float | None, ready_at: float) -> None:
        self.port, self.ready_at = port, ready_at
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.requests = 0
        bench = self

        class Handler(http.server.BaseHTTPRequestHandler):
            # As llama-server answers (llama-cpp-python 0.3.36's llama.cpp, its
            # vendored cpp-httplib, read): HTTP/1.1, the connection kept for up
            # to 100 requests (CPPHTTPLIB_KEEPALIVE_MAX_COUNT), then
            # "Connection: close"; 503 {"error": ... "Loading model"} meanwhile.
            protocol_version = "HTTP/1.1"
            served = 0

            def do_GET(self) -> None:  # noqa: N802
                bench.requests += 1
                self.served += 1
                ok = time.monotonic() >= bench.ready_at
                body = b'{"status":"ok"}' if ok else (
                    b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}')
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                if self.served >= 100:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.handler = Handler
        self.httpd: http.server.HTTPServer | None = None
        if listen_at is not None:
            threading.Thread(target=self._listen_at, args=(listen_at,), daemon=True).start()

    def _listen_at(self, when: float) -> None:
        time.sleep(max(0.0, when - time.monotonic()))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler,
                                                bind_and_activate=False)
        httpd.socket.close()
        httpd.socket = self.sock
        httpd.server_activate()
        httpd.handle_error = lambda *a: None   # type: ignore[method-assign]  # a killed hook's kept connection
        self.httpd = httpd
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
        self.sock.close()


INTERVAL: list[str] = []      # --interval for the hook, when the bench is given one


def hook(tree: Path, port: int, timeout: float) -> tuple[float, float]:
    """Run wait-ready; (CPU seconds, exit time on the monotonic clock)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([sys.executable, "-m", "infer_units", "wait-ready", "--url",
                             f"http://127.0.0.1:{port}/health", "--timeout", f"{timeout}s",
                             *INTERVAL],
                            env=env, cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)   # cwd: -m looks there first
    _pid, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime, time.monotonic()


def ran_ns(pid: int) -> int:
    """CPU time the kernel has charged to pid's threads so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


SETTLE_S = 1.5      # past the interpreter's start and the first second's faster polls


def cpu(tree: Path, scenario: str, wait: float, first_second: bool = False) -> float:
    """Seconds of CPU wait-ready spends in `wait` seconds of waiting: from
    SETTLE_S after its start, or (first_second) from its first look at the
    port."""
    port = free_port()
    never = time.monotonic() + 10 * wait + 3600
    server = None
    if scenario == "bound":
        server = Server(port, None, never)
    elif scenario == "loading":
        server = Server(port, time.monotonic(), never)
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([sys.executable, "-m", "infer_units", "wait-ready", "--url",
                             f"http://127.0.0.1:{port}/health", "--timeout", f"{wait + 60}s",
                             *INTERVAL],
                            env=env, cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE if first_second else subprocess.DEVNULL)
    try:
        if first_second:
            assert proc.stderr is not None
            line = proc.stderr.readline()     # "... not listening yet": its first poll is done
            if b"waiting for" not in line:
                raise RuntimeError(f"wait-ready said {line!r} first")
        else:
            time.sleep(SETTLE_S)
        measured_from = time.monotonic()
        before = ran_ns(proc.pid)
        time.sleep(measured_from + wait - time.monotonic())
        after = ran_ns(proc.pid)
        if proc.poll() is not None:
            raise RuntimeError(f"wait-ready exited early ({proc.returncode})")
    finally:
        proc.kill()
        proc.wait()
        if server is not None:
            server.close()
    return (after - before) / 1e9


def lag(tree: Path, scenario: str, after: float) -> float:
    port = free_port()
    now = time.monotonic()
    if scenario == "bound":       # vLLM: listens only once ready
        server = Server(port, now + after, now + after)
    else:                         # llama.cpp: listens at once, 503 until loaded
        server = Server(port, now, now + after)
    try:
        _, done = hook(tree, port, 60)
    finally:
        server.close()
    return done - server.ready_at


def busy_host(count: int) -> list[socket.socket]:
    """`count` established loopback connections (two sockets each)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held = [listener]
    for _ in range(count // 2):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        held += [client, server]
    return held


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, default=ROOT)
    p.add_argument("--wait", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--interval", help="wait-ready's --interval (default: its own)")
    p.add_argument("--scenarios", default="absent,bound,loading")
    p.add_argument("--sockets", type=int, default=2000,
                   help="open loopback connections meanwhile, as on a busy host (every "
                        "one is a line of /proc/net/tcp)")
    a = p.parse_args()
    keep = busy_host(a.sockets)  # noqa: F841  (held open)
    if a.interval:
        INTERVAL.extend(["--interval", a.interval])
    chosen = a.scenarios.split(",")
    print(f"wait-ready of {a.tree} ({sys.executable}), {a.sockets} other TCP sockets, "
          f"--interval {a.interval or 'default'}")
    cases = [(s, False) for s in ("absent", "bound", "loading") if s in chosen]
    if "absent" in chosen:
        cases.append(("absent", True))
    for scenario, first_second in cases:
        samples = [cpu(a.tree, scenario, a.wait, first_second) * 10 / a.wait
                   for _ in range(3)]
        per10 = statistics.median(samples)
        name = f"{scenario}, first second in" if first_second else scenario
        print(f"  {name:24} {per10:6.3f} s CPU per 10 s of waiting = {per10 * 10:5.2f}% "
              f"of a core (goal < 1%: {'met' if per10 < 0.1 else 'NOT met'}; samples "
              f"{', '.join(f'{x * 10:.2f}%' for x in samples)})")
    ready_after = [(s, 1.0, 0.137, "") for s in ("bound", "loading") if s in chosen]
    if "bound" in chosen:
        ready_after.append(("bound", 0.4, 0.5 / max(1, a.runs - 1), " in the first second"))
    for scenario, first, step, when in ready_after:
        lags = [lag(a.tree, scenario, first + step * i) for i in range(a.runs)]
        print(f"  lag {scenario:8} median {statistics.median(lags) * 1000:5.1f} ms, max "
              f"{max(lags) * 1000:5.1f} ms over {a.runs} runs{when} (goal < 100 ms: "
              f"{'met' if max(lags) < 0.1 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

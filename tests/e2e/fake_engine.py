#!/usr/bin/python3
"""Stand-in inference servers for the end-to-end tests, one per engine, each
reproducing what a unit depends on (README.md, "Engines", says which upstream
versions these were read in).  The personality comes from the name it runs
under:

  fake-engine --port P [--load S] [--crash-after S] [--workers N] [--record F] [--notify]
              [--hang-file F]
      engine = "command": holds its GPUs with N workers (one ignores SIGTERM),
      loads, then answers /health 200 (after FAKE_HEALTH_S).  It hangs with
      its process alive (liveness tests) FAKE_HANG_AFTER_S after becoming
      ready, or at the first /health once F exists (F is removed: the next
      process is healthy): /health then never answers, or answers 503 when
      FAKE_HANG_MODE=503 (or F holds "503").
  fake-python -m sglang.launch_server --model-path M --tp-size N --host H --port P ...
      SGLang: the HTTP server starts only once the schedulers are ready; /health
      answers 503 while warming up and while shutting down, otherwise sleeps
      FAKE_HEALTH_S (1 s, like upstream) and "generates a token" before 200.
      SIGTERM: /health 503, drain in-flight requests, kill the process tree.
  fake-python -m vllm.entrypoints.cli.main serve M --tensor-parallel-size N ...
      vLLM: binds its port at once but listens only when the engine is up;
      aborts its own start after VLLM_ENGINE_READY_TIMEOUT_S (600 s default);
      API server -> EngineCore -> workers; /health 200 once up.  Like the real
      vLLM 0.32 (docs/engines.md, "What each does on SIGTERM"): SIGTERM early in the
      load ends it, but from FAKE_IGNORE_TERM_FROM_S into the load (default:
      half of it) SIGTERM is ignored and it goes on to serve; when EngineCore
      dies (SIGKILL, or by itself FAKE_ENGINE_DIES_S after the start) the API
      server exits 0.
  fake-python <anything else>: the real python3 with a CPU stand-in for torch
      (the P2P self-test runs with the engine's interpreter).
  fake-tgi --model-id M --num-shard N --hostname H --port P [--master-port]
           [--prometheus-port] [--shard-uds-path]
      TGI: launcher -> shards (with several shards rank 0 binds the torch
      master port; each shard's socket <uds-path>-<rank> appearing means ready;
      an old socket of that name is deleted first, as upstream does) -> router
      (checks the prometheus port, then HTTP).  A taken port fails the start
      like upstream.  SIGTERM: graceful termination of the children.
  fake-llama-server --model M --host H --port P
      llama.cpp: one process, listens at once, /health 503 "Loading model"
      until loaded; POST /v1/completions (and /completion) the same, then 200.
  (vLLM's POST /v1/completions: 200 after FAKE_GENERATE_S, 404 for a model
  name it does not serve (--served-model-name, else the model path; no name
  is its model); it never answers while EngineCore is stopped (SIGSTOP),
  while /health still says 200, as the real 0.32 did under the units.)

Timings come from the environment (the model's [env]): FAKE_LOAD_S (1),
FAKE_HEALTH_S (SGLang's 1 s sleep), FAKE_WARMUP_S (SGLang 0.5), FAKE_DRAIN_S
(0.2), FAKE_RECORD (write argv and environment as JSON to this file).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import socket
import sys
import threading
import time

TORCH_STANDIN = "/usr/local/lib/fake-torch"


# ------------------------------------------------------------------ shared

def gpu_files() -> list[str]:
    """The fake device files of the GPUs CUDA would show this process."""
    table = os.environ.get("INFER_UNITS_FAKE_GPUS")
    if not table:
        return []
    with open(table) as f:
        gpus = json.load(f)["gpus"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [g["device"] for g in gpus]
    chosen = []
    for item in visible.split(","):
        for g in gpus:
            if item == str(g["index"]) or item == g["uuid"]:
                chosen.append(g["device"])
    return chosen


def set_comm(title: str) -> None:
    """The process name /proc/PID/comm shows, as the real engines set theirs."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, title.encode()[:15] + b"\0", 0, 0, 0)   # PR_SET_NAME


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def say(engine: str, message: str) -> None:
    print(f"fake-{engine}: {message}", flush=True)


def record(path: str | None) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"argv": sys.argv, "env": dict(os.environ), "pid": os.getpid()}, f,
                      ensure_ascii=False)


def notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.sendall(message.encode())


def spawn_workers(count: int, files: list[str], stubborn: bool = True) -> list[int]:
    """TP workers (like torch.multiprocessing spawn): they hold the GPUs and
    never exit on their own; the first ignores SIGTERM."""
    pids = []
    for n in range(count):
        pid = os.fork()
        if pid == 0:
            held = [open(path, "rb") for path in files]  # noqa: F841  (held open)
            if n == 0 and stubborn:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(3600)
        pids.append(pid)
    return pids


def kill_tree(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# The known-answer check's request paths (helpers/act/canary.py): a fake
# with no POST of its own answers them greedily, the same every time, in a
# shape every API reads (FAKE_ANSWER changes the text: a silent fault).
CANARY_PATHS = ("/v1/completions", "/completion", "/generate")


def greedy_answer() -> dict:
    text = os.environ.get("FAKE_ANSWER", "1")
    ids = [ord(c) for c in text]
    return {"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "content": text, "tokens": ids, "generated_text": text,
            "details": {"tokens": [{"id": i} for i in ids]}}


class Server:
    """An HTTP server on (host, port) whose GET answers come from `answer(path)`."""

    def __init__(self, host: str, port: int, answer, sock: socket.socket | None = None,
                 post=None, post_json: bool = False) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if post is None:
                    self._send(*((200, greedy_answer()) if self.path in CANARY_PATHS
                                 else (404, "")))
                elif not post_json:
                    self._send(*post(self.path))
                else:       # post(path, the JSON body): 400 for a body that is not JSON
                    try:
                        body = json.loads(data or b"{}")
                    except ValueError:
                        body = None
                    self._send(*(post(self.path, body) if isinstance(body, dict)
                                 else (400, {"error": {"message": "invalid JSON"}})))

            def do_GET(self) -> None:  # noqa: N802
                self._send(*answer(self.path))

            def _send(self, code: int, body) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        http.server.ThreadingHTTPServer.address_family = family
        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler,
                                                     bind_and_activate=sock is None)
        if sock is not None:      # bound earlier by the caller; listen now
            self.httpd.socket.close()
            self.httpd.socket = sock
            self.httpd.server_activate()
        self.httpd.daemon_threads = True
        # shutdown() waits for serve_forever's next poll: at the default 0.5 s
        # that made each stop 0-0.5 s longer at random (bench/restart_bench.py).
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


class Group:
    """A multi-node group's rendezvous, as torch.distributed forms it over TCP:
    rank 0 listens on the rendezvous address, every other rank connects (for
    FAKE_JOIN_TIMEOUT_S, 30 s, then fails like a store timeout) and says its
    rank; the group is formed once all joined.  No rank can rejoin: when a
    peer goes away the others hang, as in an NCCL collective on a dead peer
    (FAKE_ON_PEER_LOSS=exit: they exit 1 instead)."""

    def __init__(self, engine: str, nnodes: int, rank: int, host: str, port: int) -> None:
        self.engine, self.nnodes, self.rank = engine, nnodes, rank
        self.host, self.port = host, port
        self.peers: list[socket.socket] = []
        self.lost = threading.Event()

    def form(self, stop: threading.Event) -> bool:
        if self.rank == 0:
            # Like a TCPStore it listens as long as the group lives: a rank
            # that comes late connects, but is never let into the group.
            self.server = server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("0.0.0.0", self.port))
            server.listen()
            server.settimeout(0.2)
            joined: set[int] = set()
            while len(joined) < self.nnodes - 1:
                if stop.is_set():
                    return False
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                conn.settimeout(5)
                try:
                    line = conn.makefile().readline()   # probes connect and say nothing
                except OSError:
                    line = ""
                if line.startswith("rank "):
                    joined.add(int(line.split()[1]))
                    conn.settimeout(None)
                    self.peers.append(conn)
                    say(self.engine, f"rank {line.split()[1]} joined ({len(joined) + 1}/{self.nnodes})")
                else:
                    conn.close()
            for conn in self.peers:
                conn.sendall(b"welcome\n")
        else:
            deadline = time.monotonic() + env_float("FAKE_JOIN_TIMEOUT_S", 30.0)
            while True:
                try:
                    conn = socket.create_connection((self.host, self.port), timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        say(self.engine, f"DistStoreError: timed out connecting to "
                            f"{self.host}:{self.port}")
                        raise SystemExit(1)
                    if stop.wait(0.5):
                        return False
            conn.sendall(f"rank {self.rank}\n".encode())
            conn.settimeout(env_float("FAKE_JOIN_TIMEOUT_S", 30.0))
            try:
                welcome = conn.makefile().readline()
            except OSError:
                welcome = ""
            if welcome != "welcome\n":
                say(self.engine, "DistStoreError: timed out waiting for the group to form "
                    "(a running group takes no new rank)")
                raise SystemExit(1)
            conn.settimeout(None)
            self.peers.append(conn)
        for conn in self.peers:
            threading.Thread(target=self._watch, args=(conn,), daemon=True).start()
        return True

    def _watch(self, conn: socket.socket) -> None:
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        say(self.engine, "lost a peer of the group")
        if os.environ.get("FAKE_ON_PEER_LOSS") == "exit":
            os._exit(1)
        self.lost.set()

    def hang_if_lost(self) -> None:
        if self.lost.is_set():
            while True:           # a collective that never completes
                time.sleep(3600)


def group_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)


# ------------------------------------------------------------------ command

def generic(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fake-engine")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--crash-after", type=float, default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--record", default=None)
    p.add_argument("--notify", action="store_true")
    p.add_argument("--hang-file", default=None)
    args, _extra = p.parse_known_args(argv)
    record(args.record)
    files = gpu_files()
    held = [open(path, "rb") for path in files]
    spawn_workers(args.workers, files)
    stop = on_sigterm()
    started = time.monotonic()
    while time.monotonic() < started + args.load:
        if args.crash_after is not None and time.monotonic() >= started + args.crash_after:
            say("engine", "crashing while loading")
            return 7
        if stop.wait(0.05):
            return 0
    server = Server(args.host, args.port, _generic_health(args.hang_file))
    say("engine", f"serving on {args.host}:{args.port} with {len(held)} GPU file(s)")
    if args.notify:
        notify("READY=1")
    stop.wait()
    time.sleep(0.1)     # drain; the workers are left to systemd's KillMode=mixed
    server.httpd.shutdown()
    return 0


def _generic_health(hang_file: str | None):
    """/health for fake-engine: slow (FAKE_HEALTH_S), or hung while the process lives."""
    health_s = env_float("FAKE_HEALTH_S", 0.0)
    hang_after = os.environ.get("FAKE_HANG_AFTER_S")
    state = {"hung": None, "at": time.monotonic() + float(hang_after) if hang_after else None}

    def answer(path: str):
        if path != "/health":
            return 404, "no\n"
        if state["hung"] is None and hang_file and os.path.exists(hang_file):
            with open(hang_file) as f:
                state["hung"] = f.read().strip() or "silent"
            os.unlink(hang_file)
            say("engine", f"hanging ({state['hung']}), process alive")
        if state["hung"] is None and state["at"] is not None and time.monotonic() >= state["at"]:
            state["hung"] = os.environ.get("FAKE_HANG_MODE", "silent")
            say("engine", f"hanging ({state['hung']}) after {hang_after}s, process alive")
        if state["hung"] == "503":
            return 503, "wedged\n"
        if state["hung"] is not None:
            while True:               # like a deadlocked scheduler: no answer ever
                time.sleep(3600)
        time.sleep(health_s)
        return 200, "ok\n"

    return answer


# ------------------------------------------------------------------ sglang

def sglang(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--dist-init-addr", default=None)
    group_args(p)
    args, _extra = p.parse_known_args(argv)
    record(os.environ.get("FAKE_RECORD"))
    # sglang sets this for itself whatever the environment says
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    files = gpu_files()
    workers = spawn_workers(args.tp_size // args.nnodes, files)
    stop = on_sigterm()
    group = None
    if args.nnodes > 1:
        host, _, port = args.dist_init_addr.rpartition(":")
        group = Group("sglang", args.nnodes, args.node_rank, host.strip("[]"), int(port))
        if args.node_rank > 0:
            # ranks > 0 ignore SIGTERM: only rank 0 can stop the group
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if not group.form(stop):
            kill_tree(workers)
            return 0
    if stop.wait(env_float("FAKE_LOAD_S", 1.0)):     # schedulers loading: no HTTP yet
        kill_tree(workers)
        return 0
    if group is not None and args.node_rank > 0:
        # a dummy health server: 200 whatever becomes of the group
        Server(args.host, args.port, lambda path: (200, "") if path in (
            "/health", "/health_generate", "/ping") else (404, ""))
        say("sglang", f"rank {args.node_rank} up, dummy health on {args.host}:{args.port}")
        while True:
            time.sleep(3600)
    state = {"warm_until": time.monotonic() + env_float("FAKE_WARMUP_S", 0.5),
             "shutting_down": False, "in_flight": 0}
    health_s = env_float("FAKE_HEALTH_S", 1.0)

    def answer(path: str):
        if path not in ("/health", "/health_generate"):
            return 404, {"detail": "Not Found"}
        if state["shutting_down"] or time.monotonic() < state["warm_until"]:
            return 503, ""
        if group is not None:
            group.hang_if_lost()      # the token never comes
        time.sleep(health_s)          # upstream: sleep 1 s, then generate one token
        return 200, ""

    Server(args.host, args.port, answer)
    say("sglang", f"server ready on {args.host}:{args.port}, tp {args.tp_size}, "
        f"custom all-reduce {'off' if args.disable_custom_all_reduce else 'on'}")
    stop.wait()
    state["shutting_down"] = True
    time.sleep(env_float("FAKE_DRAIN_S", 0.2))       # in-flight requests drain
    kill_tree(workers)                               # then it kills its process tree
    return 0


# ------------------------------------------------------------------ vllm

def vllm(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--served-model-name", nargs="+", default=None)
    group_args(p)
    args, _extra = p.parse_known_args(argv[1:])
    served = args.served_model_name or [args.model]
    record(os.environ.get("FAKE_RECORD"))
    host = args.host or "0.0.0.0"
    if args.nnodes > 1 and args.node_rank > 0 and not args.headless:
        say("vllm", "ValueError: remote engine ranks must use --headless")
        return 1
    # The API server binds its socket before the engine starts, and listens later.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, args.port))
    ready_timeout = env_float("VLLM_ENGINE_READY_TIMEOUT_S", 600.0)
    engine_core = os.fork()
    if engine_core == 0:                     # EngineCore with its workers
        set_comm("VLLM::EngineCore")          # the real one's title (comm: 15 chars)
        sock.close()
        spawn_workers(args.tensor_parallel_size // args.nnodes, gpu_files())
        while True:
            time.sleep(3600)
    # The real API server exits 0 when its EngineCore dies, loading or serving.
    # When the API server itself ends EngineCore (a stop, its own start
    # timeout) its own exit status stands: the watcher, woken by that death,
    # must not exit 0 first.
    ending = threading.Event()

    def end(code: int) -> int:
        ending.set()
        kill_tree([engine_core])
        return code

    def watch_engine_core() -> None:
        os.waitpid(engine_core, 0)
        if ending.is_set():
            return
        say("vllm", "EngineCore died; API server shutting down")
        os._exit(0)

    threading.Thread(target=watch_engine_core, daemon=True).start()
    dies_s = os.environ.get("FAKE_ENGINE_DIES_S")
    if dies_s is not None:
        threading.Timer(float(dies_s), lambda: kill_tree([engine_core])).start()
    stop = on_sigterm()
    group = None
    if args.nnodes > 1:
        group = Group("vllm", args.nnodes, args.node_rank, args.master_addr, args.master_port)
        if not group.form(stop):
            return end(0)
        if args.headless:                    # no API server: workers until stopped
            sock.close()
            say("vllm", f"headless rank {args.node_rank} joined")
            stop.wait()
            return end(0)
    load = env_float("FAKE_LOAD_S", 1.0)
    # SIGTERM ends the load only before this point; after it the real vLLM
    # ignored SIGTERM, finished loading and served.
    deaf_from = min(env_float("FAKE_IGNORE_TERM_FROM_S", load / 2), load, ready_timeout)
    if stop.wait(deaf_from):
        return end(0)
    signal.signal(signal.SIGTERM, lambda *_: say("vllm", "SIGTERM ignored while loading"))
    say("vllm", "loading; SIGTERM is ignored from here until ready")
    time.sleep(min(load, ready_timeout) - deaf_from)
    stop = on_sigterm()
    if load > ready_timeout:
        say("vllm", f"RuntimeError: Timed out waiting for engine core processes to start "
            f"(VLLM_ENGINE_READY_TIMEOUT_S={ready_timeout:g})")
        return end(1)
    def health(path: str):
        if path != "/health":
            return 404, {"detail": "Not Found"}
        if group is not None:
            group.hang_if_lost()
        return 200, ""       # a flag: 200 even while EngineCore is wedged (vllm#36960)

    def complete(path: str, body: dict):
        if path != "/v1/completions":
            return 404, {"detail": "Not Found"}
        # The real server (0.32, run under the units): 404 for a name it does
        # not serve; no name, or an empty one, is its model.
        name = body.get("model")
        if name and name not in served:
            return 404, {"error": {"message": f"The model `{name}` does not exist.",
                                   "type": "NotFoundError", "param": "model", "code": 404}}
        while _stopped(engine_core):     # EngineCore SIGSTOPped: the token never comes
            time.sleep(0.1)
        time.sleep(env_float("FAKE_GENERATE_S", 0.0))
        return 200, {"object": "text_completion", "model": name or served[0],
                     "choices": [{"index": 0, "text": "1", "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    Server(host, args.port, health, sock=sock, post=complete, post_json=True)
    say("vllm", f"API server on {host}:{args.port}, tp {args.tensor_parallel_size}, "
        f"custom all-reduce {'off' if args.disable_custom_all_reduce else 'on'}")
    stop.wait()
    time.sleep(env_float("FAKE_DRAIN_S", 0.2))       # --shutdown-timeout 0: abort requests
    return end(0)


def python(argv: list[str]) -> int:
    modules = {"sglang.launch_server": sglang, "vllm.entrypoints.cli.main": vllm}
    if len(argv) >= 2 and argv[0] == "-m" and argv[1] in modules:
        return modules[argv[1]](argv[2:])
    os.environ["PYTHONPATH"] = TORCH_STANDIN
    os.execv("/usr/bin/python3", ["/usr/bin/python3", *argv])
    return 127


# ------------------------------------------------------------------ tgi

def _tgi_shard(rank: int, args: argparse.Namespace, files: list[str]) -> None:
    held = [open(path, "rb") for path in files]  # noqa: F841
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if rank == 0 and args.num_shard > 1:     # torch.distributed's store, several shards only
        master = socket.socket()
        master.bind(("127.0.0.1", args.master_port))
        master.listen()
    time.sleep(env_float("FAKE_LOAD_S", 1.0))
    uds = socket.socket(socket.AF_UNIX)       # the launcher sees it and calls the shard ready
    uds.bind(f"{args.shard_uds_path}-{rank}")
    uds.listen()
    while True:
        time.sleep(3600)


def tgi(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="text-generation-launcher")
    p.add_argument("--model-id", required=True)
    p.add_argument("--num-shard", type=int, default=1)
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--prometheus-port", type=int, default=9000)
    p.add_argument("--shard-uds-path", default="/tmp/text-generation-server")
    p.add_argument("--graceful-termination-timeout", type=int, default=90)
    args, _extra = p.parse_known_args(argv)
    record(os.environ.get("FAKE_RECORD"))
    files = gpu_files()
    stop = on_sigterm()
    sockets = [f"{args.shard_uds_path}-{r}" for r in range(args.num_shard)]
    for path in sockets:          # like the shard manager: an old socket is removed
        if os.path.exists(path):
            os.unlink(path)
    shards = []
    for rank in range(args.num_shard):
        pid = os.fork()
        if pid == 0:
            try:
                _tgi_shard(rank, args, files)
            except OSError as e:
                say("tgi", f"shard {rank} failed: {e}")
                os._exit(1)
        shards.append(pid)
    while not all(os.path.exists(s) for s in sockets):
        for pid in shards:
            if os.waitpid(pid, os.WNOHANG)[0]:
                say("tgi", "Shard failed to start; shutting down")
                kill_tree(shards)
                return 1
        if stop.wait(0.05):
            kill_tree(shards)
            return 0
    try:
        # The router binds the prometheus port only for a moment, but dies
        # when something listens there; then it serves HTTP.
        prometheus = socket.socket()
        prometheus.bind(("0.0.0.0", args.prometheus_port))
        prometheus.close()
        Server(args.hostname, args.port, lambda path: (200, "") if path == "/health"
               else (404, ""))
    except OSError as e:
        say("tgi", f"router failed: {e}")
        kill_tree(shards)
        return 1
    say("tgi", f"router on {args.hostname}:{args.port}, shards {args.num_shard}, "
        f"master port {args.master_port}, prometheus {args.prometheus_port}")
    stop.wait()
    for pid in shards:                # graceful termination of the shards
        os.kill(pid, signal.SIGTERM)
    time.sleep(env_float("FAKE_DRAIN_S", 0.2))
    return 0


# ------------------------------------------------------------------ llama.cpp

def llamacpp(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llama-server")
    p.add_argument("--model", "-m")
    p.add_argument("--hf-repo", "-hf")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    args, _extra = p.parse_known_args(argv)
    record(os.environ.get("FAKE_RECORD"))
    held = [open(path, "rb") for path in gpu_files()]  # noqa: F841  one process, every GPU
    loaded_at = time.monotonic() + env_float("FAKE_LOAD_S", 1.0)

    def answer(path: str):
        if path != "/health":
            return 404, ""
        if time.monotonic() < loaded_at:
            return 503, {"error": {"code": 503, "message": "Loading model",
                                   "type": "unavailable_error"}}
        return 200, {"status": "ok"}

    def complete(path: str):
        if path not in ("/v1/completions", "/completion"):
            return 404, ""
        if time.monotonic() < loaded_at:
            return 503, {"error": {"code": 503, "message": "Loading model",
                                   "type": "unavailable_error"}}
        return 200, greedy_answer()

    server = Server(args.host, args.port, answer, post=complete)   # listens before loading
    say("llamacpp", f"listening on {args.host}:{args.port}")
    on_sigterm().wait()
    server.httpd.shutdown()
    return 0


PERSONALITIES = {"fake-engine": generic, "fake-python": python, "fake-tgi": tgi,
                 "fake-llama-server": llamacpp}

if __name__ == "__main__":
    sys.exit(PERSONALITIES[os.path.basename(sys.argv[0])](sys.argv[1:]))

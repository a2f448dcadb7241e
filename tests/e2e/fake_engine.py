#!/usr/bin/python3
"""A stand-in inference server for the end-to-end tests.

Like a tensor-parallel server it holds "its GPUs" (the fake device files of
CUDA_VISIBLE_DEVICES, looked up in INFER_UNITS_FAKE_GPUS), forks workers that
hold them too (one ignores SIGTERM), loads for a while, then answers
GET /health with 200.  On SIGTERM the main process drains briefly and exits,
leaving its workers behind for systemd's KillMode=mixed to SIGKILL.

    fake-engine --port P [--load S] [--crash-after S] [--workers N]
                [--record FILE] [--notify] [extra args...]
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


def gpu_files() -> list[str]:
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


def notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.sendall(message.encode())


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        ok = self.path == "/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"ok\n" if ok else b"no\n")

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--crash-after", type=float, default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--record", default=None)
    p.add_argument("--notify", action="store_true")
    args, _extra = p.parse_known_args()
    if args.record:
        with open(args.record, "w", encoding="utf-8") as f:
            json.dump({"argv": sys.argv, "env": dict(os.environ)}, f, ensure_ascii=False)
    held = [open(path, "rb") for path in gpu_files()]
    for n in range(args.workers):
        if os.fork() == 0:
            if n == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a stubborn TP worker
            # Workers keep the GPU files; they never exit on their own.
            while True:
                time.sleep(3600)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    loaded_at = time.monotonic() + args.load
    while time.monotonic() < loaded_at:
        if args.crash_after is not None and time.monotonic() >= loaded_at - args.load + args.crash_after:
            print("fake-engine: crashing while loading", flush=True)
            return 7
        if stop.wait(0.05):
            return 0
    server = http.server.ThreadingHTTPServer((args.host, args.port), Health)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"fake-engine: serving on {args.host}:{args.port} with {len(held)} GPU file(s)", flush=True)
    if args.notify:
        notify("READY=1")
    stop.wait()
    time.sleep(0.1)     # drain
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The hooks' stop and ready paths with real processes and sockets: wait-ready
stopped while the server loads, ports bound but not listening, TIME_WAIT
leftovers (the same paths under real systemd: tests/e2e/test_lifecycle_e2e.py)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time

import pytest

from ..support import PYTHON, base_env, wait_until

# A loading server that ignores SIGTERM (vLLM 0.32 did, 20-25 s into its load).
DEAF_SERVER = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('loading', flush=True); time.sleep(3600)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-m", "infer_units", "wait-ready", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=base_env())


def test_sigterm_while_loading_kills_the_server_and_exits_0() -> None:
    server = subprocess.Popen([PYTHON, "-c", DEAF_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "loading\n"
    hook = wait_ready("--url", f"http://127.0.0.1:{free_port()}/health", "--pid",
                      str(server.pid), "--timeout", "60s")
    try:
        # its first journal line says it waits: the handler is in place by then
        assert hook.stderr is not None and "waiting for" in hook.stderr.readline()
        stopped = time.monotonic()
        hook.send_signal(signal.SIGTERM)       # systemd's stop, to the control process
        server.send_signal(signal.SIGTERM)     # and to the main process, which ignores it
        assert hook.wait(120) == 0
        assert server.wait(120) == -signal.SIGKILL
        took = time.monotonic() - stopped
        rest = hook.stderr.read()
        assert f"killing the server pid {server.pid}" in rest and "stopped while" in rest, rest
        # Killed at the stop, not left to end by itself (it sleeps an hour).
        assert took < 60, f"stopped after {took:.1f}s"
    finally:
        for p in (hook, server):
            if p.poll() is None:
                p.kill()
                p.wait()


def _generated_wait_ready(tmp_path, port: int, pid: int) -> list[str]:
    """wait-ready's command line as the generator writes it into a unit, with
    this tree's CLI for /usr/bin/infer-units and the server's pid for $MAINPID."""
    from ..support import run_generator
    from ..unitfile import exec_argv, values
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(f'engine = "command"\ncommand = ["/bin/true"]\nport = {port}\n')
    done = run_generator(tmp_path / "out", str(etc))
    assert done.returncode == 0, done.stderr
    argv = exec_argv(values((tmp_path / "out/m.service").read_text(), "Service",
                            "ExecStartPost")[0])
    cli = argv.index("/usr/bin/infer-units")
    return [*argv[:cli], PYTHON, "-m", "infer_units",
            *[str(pid) if w == "$MAINPID" else w for w in argv[cli + 1:]]]


def test_sigterm_before_the_handler_is_in_place_still_ends_the_load(tmp_path) -> None:
    """systemd's stop can reach wait-ready while Python is still starting
    (~60 ms of imports before its handler): the unit starts it with SIGTERM
    blocked, so the stop is held until the handler takes it."""
    server = subprocess.Popen([PYTHON, "-c", DEAF_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "loading\n"
    argv = _generated_wait_ready(tmp_path, free_port(), server.pid)
    hook = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=base_env())
    python = os.path.realpath(PYTHON)
    try:
        # The stop comes as soon as the hook is the interpreter (any wrapper
        # before it has exec'd it): the earliest moment of the old window.
        def interpreter() -> bool:
            try:
                return os.path.realpath(f"/proc/{hook.pid}/exe") == python
            except OSError:
                return False
        assert wait_until(interpreter, 10, step=0.0002, max_step=0.0002), argv
        hook.send_signal(signal.SIGTERM)
        server.send_signal(signal.SIGTERM)
        assert hook.wait(20) == 0, (argv, hook.stderr.read() if hook.stderr else "")
        assert server.wait(10) == -signal.SIGKILL
        assert hook.stderr is not None and "stopped while" in hook.stderr.read()
    finally:
        for p in (hook, server):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sigterm_once_ready_leaves_the_server_alone() -> None:
    port = free_port()
    server = subprocess.Popen([PYTHON, "-c", (
        "import http.server as h\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"h.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")])
    try:
        hook = wait_ready("--url", f"http://127.0.0.1:{port}/health", "--pid", str(server.pid),
                          "--timeout", "60s")
        assert hook.wait(30) == 0
        assert server.poll() is None, "wait-ready must not touch a server that answered"
    finally:
        server.kill()
        server.wait()


def test_a_port_bound_but_not_listening_is_held_and_named() -> None:
    from infer_units.helpers.facts.ports import port_users, wait_port_free
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as vLLM binds it
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
        users = port_users("127.0.0.1", port)
        assert users is not None and [(i.pid, how) for i, how in users] == \
            [(os.getpid(), "bound, not listening yet")]
        assert not wait_port_free("127.0.0.1", port, 0.2)
        s.listen()
        assert [how for _i, how in port_users("127.0.0.1", port) or []] == ["listening"]
    assert wait_port_free("127.0.0.1", port, 1.0)


def test_ipv6_holders_are_seen_by_the_same_dump() -> None:
    """One sock_diag dump answers for both families (facts/ports.py): an IPv6
    socket only bound, then listening, holds its port as an IPv4 one does."""
    from infer_units.helpers.facts.ports import port_users
    if not socket.has_ipv6 or not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("no IPv6 on this host")
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
        assert [(i.pid, how) for i, how in port_users("::1", port) or []] == \
            [(os.getpid(), "bound, not listening yet")]
        s.listen()
        assert [how for _i, how in port_users("::1", port) or []] == ["listening"]
    assert port_users("::1", port) == []


def _holding_states(port: int) -> list[str]:
    """What kind of socket, if any, uses `port` in each family (/proc)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        found += [line.split()[3] for line in lines if line.split()[1].endswith(f":{port:04X}")]
    return found


def _connection_on_a_closed_port(time_wait: bool) -> tuple[int, list[socket.socket]]:
    """A port whose listener is gone: its accepted connection still open
    (time_wait=False: both ends returned, to be closed by the caller), or
    closed by the server side first, leaving TIME_WAIT on the port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    listener.close()
    if not time_wait:
        return port, [client, accepted]
    accepted.close()          # the server side closes first: TIME_WAIT on `port`
    client.close()
    assert "06" in _holding_states(port), "no TIME_WAIT left: the test proves nothing"
    return port, []


def test_time_wait_leftovers_are_not_holders() -> None:
    from infer_units.helpers.facts.ports import port_users, wait_port_free
    port, _ = _connection_on_a_closed_port(time_wait=True)
    assert port_users("127.0.0.1", port) == []
    assert wait_port_free("127.0.0.1", port, 1.0)


@pytest.mark.parametrize("case", ["listening v4", "bound v4 reuseaddr", "bound v4",
                                  "listening v6", "bound v6 only", "time-wait",
                                  "accepted, listener gone", "reuseport",
                                  "bound v4 wildcard", "bound v6 dual-stack wildcard",
                                  "bound v6 v4-mapped", "bound v4 to lo",
                                  "reuseport, another uid"])
def test_unused_is_false_for_every_socket_that_uses_the_port(case: str) -> None:
    """facts/ports.unused: the bind() pre-start tries before any dump must
    collide with every kind of socket on the port, in either family, or a
    start would go on over a holder unnamed."""
    from infer_units.helpers.facts.ports import unused, wait_port_free
    v6 = socket.has_ipv6 and os.path.exists("/proc/net/if_inet6")
    if "v6" in case and not v6:
        pytest.skip("no IPv6 on this host")
    kept: list[socket.socket] = []
    try:
        if case == "time-wait" or case == "accepted, listener gone":
            port, open_ends = _connection_on_a_closed_port(time_wait=case == "time-wait")
            kept += open_ends
        elif case == "reuseport, another uid":
            # nobody's SO_REUSEPORT listener: a root bind with SO_REUSEPORT
            # would not join it (another uid), ours has none and collides.
            if os.geteuid() != 0:
                pytest.skip("needs root to run a holder as nobody")
            port = free_port()
            holder = subprocess.Popen(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-c",
                 "import socket, sys, time; s = socket.socket(); "
                 "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); "
                 f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); "
                 "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert holder.stdout is not None and holder.stdout.readline() == "up\n"
                assert not unused(port)
                assert not wait_port_free("127.0.0.1", port, 0.0)
            finally:
                holder.kill()
                holder.wait()
            return
        else:
            family = socket.AF_INET6 if "v6" in case else socket.AF_INET
            s = socket.socket(family, socket.SOCK_STREAM)
            kept.append(s)
            if "reuseaddr" in case:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if case == "reuseport":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if case == "bound v6 only":
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if case == "bound v6 dual-stack wildcard":
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            if case == "bound v4 to lo":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
            address = {"bound v4 wildcard": "0.0.0.0", "bound v6 dual-stack wildcard": "::",
                       "bound v6 v4-mapped": "::ffff:127.0.0.1"}.get(
                case, "::1" if family == socket.AF_INET6 else "127.0.0.1")
            s.bind((address, 0))
            port = s.getsockname()[1]
            if case.startswith("listening") or case == "reuseport":
                s.listen()
        assert not unused(port), case
        # unused() False only sends the look to the dump: a leftover of a
        # connection is no holder there (the server binds over it), a
        # bound or listening socket is.
        # The server's address is the holder's own (a holder on ::1 takes
        # nothing from a bind of 127.0.0.1: test_port_holders.py).
        leftover = case in ("time-wait", "accepted, listener gone")
        host = "::1" if case in ("listening v6", "bound v6 only") else "127.0.0.1"
        assert wait_port_free(host, port, 0.0) is leftover, case
    finally:
        for s in kept:
            s.close()


def test_unused_is_true_for_a_port_nothing_uses() -> None:
    from infer_units.helpers.facts.ports import unused
    port = free_port()
    assert _holding_states(port) == [] or pytest.skip("the port was taken meanwhile")
    assert unused(port)
    assert unused(port), "the probe's own socket must not be left holding the port"


def test_wait_port_says_who_holds_a_bound_port() -> None:
    port = free_port()
    holder = subprocess.Popen([PYTHON, "-c", (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('0.0.0.0', {port})); print('bound', flush=True); time.sleep(3600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "bound\n"
        done = subprocess.run([PYTHON, "-m", "infer_units", "wait-port", "--port", str(port),
                               "--timeout", "0.5s"], capture_output=True, text=True,
                              env=base_env(), timeout=60)
        assert done.returncode == 3, done.stderr
        assert f"port {port} held by pid {holder.pid}" in done.stderr
        assert "bound, not listening yet" in done.stderr
    finally:
        holder.kill()
        holder.wait()


def test_start_limit_is_left_alone_outside_the_units_own_cgroup(
        caplog: pytest.LogCaptureFixture) -> None:
    """pre-start resets the start-limit counter only as the hook of that unit
    (run by systemd, in its cgroup): by hand or from a test it asks nothing."""
    from infer_units.helpers.act import startlimit
    caplog.set_level(logging.DEBUG, logger="infer_units")
    env = {"INVOCATION_ID": "0123456789abcdef0123456789abcdef"}
    assert not startlimit.forgive_asked_start("iu-not-this.service", env)
    assert not startlimit.forgive_asked_start("iu-not-this.service", {})
    assert caplog.records == []


def test_the_start_limit_question_beside_the_checks_hands_back_its_outcome(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """pre-start asks systemd in a thread (act/startlimit.py): its waiter gives
    the answer, and what escaped the thread is raised by the waiter, for the
    hook's one handler, not lost on the thread's stderr."""
    from infer_units.helpers.act import startlimit
    caplog.set_level(logging.DEBUG, logger="infer_units")
    wait = startlimit.forgive_asked_start_meanwhile("iu-not-this.service")
    assert wait() is False and caplog.records == []

    def broken(unit: str, environ: object = None) -> bool:
        raise LookupError(f"{unit}: a bug")
    monkeypatch.setattr(startlimit, "forgive_asked_start", broken)
    wait = startlimit.forgive_asked_start_meanwhile("iu-x.service")
    with pytest.raises(LookupError, match="iu-x.service: a bug"):
        wait()


def test_a_failed_start_limit_question_never_decides_the_start(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """pre-start waits for its start-limit thread on every way out; what
    escaped the thread is an error line, and the checks' own result stands
    (a refusal stays a refusal, a pass a pass)."""
    from infer_units.helpers.act import startlimit
    from infer_units.helpers.hooks import unit

    def broken(name: str, environ: object = None) -> bool:
        raise LookupError("a bug in the question")
    monkeypatch.setattr(startlimit, "forgive_asked_start", broken)
    caplog.set_level(logging.DEBUG, logger="infer_units")
    assert unit.pre_start(["--unit", "iu-not-this.service"]) == 0
    said = caplog.text
    assert "start checks passed" in said
    assert "start-limit question failed: LookupError: a bug in the question" in said


def test_a_refusal_waits_for_the_start_limit_question_before_it_ignores_sigterm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused start ignores SIGTERM (process-wide) so that the stop job it
    queues cannot end it first; a systemctl the start-limit thread runs
    meanwhile would inherit that.  So the question is settled first, while
    SIGTERM is still the default, and only then is the stop queued."""
    from infer_units.helpers.facts import procinfo, systemd
    from infer_units.helpers.hooks import unit
    seen: list[tuple[str, object]] = []
    monkeypatch.setattr(procinfo, "unit_of_cgroup", lambda cgroup: "iu-m.service")
    monkeypatch.setattr(systemd, "cancel_own_start",
                        lambda name: seen.append(("cancel", signal.getsignal(signal.SIGTERM))))

    def settle() -> bool:
        seen.append(("settle", signal.getsignal(signal.SIGTERM)))
        raise LookupError("what escaped the question is pre-start's finally's to say")

    before = signal.getsignal(signal.SIGTERM)
    try:
        unit._refuse_without_restart("iu-m.service", settle)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == [("settle", before), ("cancel", signal.SIG_IGN)]

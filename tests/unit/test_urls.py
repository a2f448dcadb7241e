"""One reader of URLs, hosts and host:port (generator/urls.py) for the
generator and every hook, and one HTTP probe (helpers/facts/probe.py) for
readiness and liveness.

The property: for any text in a URL-ish key ([ready] url, [nodes] head-url,
host, [nodes] addr), the generator accepts the model exactly when the hook
that gets the value on its argv accepts it, and what it accepts lands on the
hook's argv unchanged (read back with systemd's own unquoting, through
tools/systemd_exec.py) and is read the same way by the hook and by urllib
(the reference reader of URLs)."""

from __future__ import annotations

import http.server
import os
import tempfile
import urllib.parse
from pathlib import Path

import pytest

from infer_units.generator.build import load_all, render_checked
from infer_units.generator.urls import parse_host_port, parse_url
from infer_units.helpers import argtypes
from infer_units.helpers.act.rendezvous import split_addr

from ..support import base_env, http_server, run_cli
from ..unitfile import exec_argv, values

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "infer-units-hypothesis"))

MAX_EXAMPLES = int(os.environ.get("INFER_UNITS_FUZZ_EXAMPLES", "300"))


def toml_str(text: str) -> str:
    """A TOML basic string holding exactly `text` (controls escaped)."""
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


PLAIN = 'engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [0]\nport = 8000\n'
NODES = ('engine = "vllm"\nmodel = "/m"\ngpus = [0]\nport = 8000\nhost = "0.0.0.0"\n'
         '[nodes]\nhosts = ["gpu-a.example", "gpu-b.example"]\nrank = 1\n')


def generate(body: str) -> tuple[bool, str]:
    """(accepted, the unit's text or the error) for one model file."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "m.toml").write_text(body, encoding="utf-8")
        loaded = load_all(["m"], [d])
        if loaded.errors:
            return False, str(loaded.errors[0])
        return True, render_checked(loaded.models[0])[0].text


def hook_accepts(check, text: str) -> bool:
    try:
        check(text)
        return True
    except ValueError:
        return False


def hook_argv(unit: str, directive: str, hook: str) -> list[str]:
    for value in values(unit, "Service", directive):
        argv = exec_argv(value)
        if hook in argv:
            return argv
    raise AssertionError(f"no {hook} in {directive}")


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def same_as_urllib(text: str) -> None:
    """What we accept, urllib reads alike."""
    ours = parse_url(text)
    theirs = urllib.parse.urlsplit(text)
    assert (theirs.scheme, theirs.hostname, theirs.port or ours.port) == \
        (ours.scheme, ours.host.lower(), ours.port), text
    # urllib drops an empty query ("/x?"); the request line keeps it, as curl does
    assert (theirs.path or "/") + (f"?{theirs.query}" if theirs.query else "") == \
        ours.target.removesuffix("?"), text
    assert not theirs.fragment and not theirs.username


# ---------------------------------------------------------------- strategies

def mostly(good: list[str], bad: list[str]) -> st.SearchStrategy[str]:
    """A piece that is usually plausible, so that many URLs are accepted too."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good),
                     st.sampled_from(bad))


SCHEMES = mostly(["http://", "https://"], ["HTTP://", "ftp://", "http:/", "", "http://http://"])
USERINFO = mostly([""], ["u@", "u:p@", "@", "a@b@"])
GOOD_HOSTS = ["127.0.0.1", "localhost", "gpu-a.example", "[::1]", "a_b", "0.0.0.0", "[::]",
              "xn--bcher-kva.example", "[::ffff:10.0.0.1]", "10.9.0.1", "GPU-B.Example"]
BAD_HOSTS = ["::1", "[fe80::1%eth0]", "999.1.1.1", "", "-x", "10.0.0.01", "ü.example",
             "[1:2:3:4:5:6:7:8:9]", "a..b", "a.-b", "x" * 64, "localhost:9999", "[127.0.0.1]",
             "1.2.3", "h\x00", "h\t", "h ", "[", "]"]
HOSTS = mostly(GOOD_HOSTS, BAD_HOSTS)
PORTS = mostly(["", ":80", ":8000", ":65535", ":1"],
               [":", ":0", ":65536", ":99999", ":abc", ":+1", ":9999:8000", ": 80", ":٣",
                ":8000\x00", ":123456"])
PATHS = mostly(["", "/", "/health", "/v1/x?y=1", "?q", "/%20", "//x", "/a@b", "/a:b"],
               ["/a#frag", "#", "/a b", "/a\tb", "/\x00", "/ü", "/a\\b", "/a?b#c",
                "/\r\nHost: evil", "/\x7f"])
noise = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)

urls = st.one_of(
    st.tuples(SCHEMES, USERINFO, HOSTS, PORTS, PATHS).map("".join),
    st.tuples(SCHEMES, HOSTS, noise, PATHS).map("".join),
)
hosts = st.one_of(HOSTS.map(lambda h: h.strip("[]")), HOSTS,
                  st.tuples(HOSTS, noise).map("".join), noise)
addrs = st.one_of(st.tuples(HOSTS, PORTS).map("".join),
                  st.tuples(HOSTS, noise).map("".join), noise)
fuzz = settings(max_examples=MAX_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- properties

@fuzz
@given(urls)
@example("http://127.0.0.1:8000/health#frag")
@example("http://user@127.0.0.1:8000/health")
@example("http://127.0.0.1:0/health")
@example("http://localhost:9999:8000/health")
@example("http://[::1]:8000/health?x=1")
def test_ready_url_generator_and_hooks_agree(url: str) -> None:
    accepted, unit = generate(PLAIN + f"[ready]\nurl = {toml_str(url)}\n")
    assert accepted == hook_accepts(argtypes.http_url, url), (url, unit)
    if accepted:
        argv = hook_argv(unit, "ExecStartPost", "wait-ready")
        assert option(argv, "--url") == url          # exactly what the file says
        same_as_urllib(url)
    else:
        assert "ready.url" in unit, unit


@fuzz
@given(urls)
@example("http://gpu-a.example:99999/health")
@example("http://gpu-a.example:abc/health")
@example("http://gpu-a.example:8000/health#x")
def test_head_url_generator_and_hooks_agree(url: str) -> None:
    accepted, unit = generate(NODES + f"head-url = {toml_str(url)}\n")
    assert accepted == hook_accepts(argtypes.http_url, url), (url, unit)
    if accepted:
        argv = hook_argv(unit, "ExecStartPre", "pre-start")
        assert option(argv, "--head-url") == url
        assert option(hook_argv(unit, "ExecStartPost", "wait-ready"), "--url") == url
        same_as_urllib(url)
    else:
        assert "nodes.head-url" in unit, unit


@fuzz
@given(hosts)
@example("localhost:9999")
@example("[::1]")
@example("::1")
@example("h\x00")
def test_host_generator_and_hooks_agree(host: str) -> None:
    accepted, unit = generate(PLAIN + f"host = {toml_str(host)}\n")
    assert accepted == hook_accepts(argtypes.host, host), (host, unit)
    if accepted:
        pre = hook_argv(unit, "ExecStartPre", "pre-start")
        assert option(pre, "--host") == host
        # the default health URL built from it is one every hook reads
        url = option(hook_argv(unit, "ExecStartPost", "wait-ready"), "--url")
        assert hook_accepts(argtypes.http_url, url), url
        assert parse_url(url).host in (host, "127.0.0.1", "::1")
    else:
        assert "host" in unit, unit


@fuzz
@given(addrs)
@example("10.9.0.1:29500")
@example("[::1]:29500")
@example("::1:29500")
@example("10.9.0.1:0")
@example("10.9.0.1:29500\x00")
def test_rendezvous_addr_generator_and_hooks_agree(addr: str) -> None:
    accepted, unit = generate(NODES + f"addr = {toml_str(addr)}\n")
    assert accepted == hook_accepts(argtypes.host_port, addr), (addr, unit)
    if accepted:
        given_addr = option(hook_argv(unit, "ExecStartPre", "pre-start"), "--wait-rendezvous")
        assert split_addr(given_addr) == parse_host_port(addr)   # what the worker connects to
    else:
        assert "nodes.addr" in unit, unit


# ---------------------------------------------------------------- the attacks of #9, by name

@pytest.mark.parametrize("key, value, reason", [
    ("ready.url", "http://127.0.0.1:8000/health#frag", "fragment"),
    ("ready.url", "http://admin:pw@127.0.0.1:8000/health", "user info"),
    ("ready.url", "http://127.0.0.1:0/health", "port 0"),
    ("nodes.head-url", "http://gpu-a.example:99999/health", "port 99999"),
    ("nodes.head-url", "http://gpu-a.example:abc/health", "port 'abc'"),
    ("host", "localhost:9999", "not a host name or IP address"),
    ("nodes.addr", "10.9.0.1:29500\x00", "NUL"),
    ("nodes.addr", "::1:29500", "brackets"),
])
def test_each_attack_is_refused_by_name(tmp_path: Path, key: str, value: str,
                                        reason: str) -> None:
    section, _, leaf = key.rpartition(".")
    body = NODES if section == "nodes" else PLAIN
    if section == "ready":
        body += "[ready]\n"
    body += f"{leaf} = {toml_str(value)}\n"
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "m.toml").write_text(body)
    done = run_cli("check", "--no-verify", env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))
    assert done.returncode == 1, done
    assert f"{etc}/m.toml: {key}: " in done.stderr and reason in done.stderr, done.stderr


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:  # noqa: N802
        Recorder.seen.append((self.path, self.headers.get("Host")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder():
    Recorder.seen = []
    with http_server(Recorder) as httpd:
        yield httpd.server_address[1]


def test_readiness_and_liveness_send_the_same_request(recorder: int, tmp_path: Path) -> None:
    """The real hooks, on one URL: the same request target and Host header."""
    url = f"http://127.0.0.1:{recorder}/health?probe=1"
    run_cli("wait-ready", "--url", url, "--timeout", "20s", check=0)
    run_cli("liveness-probe", "--unit", "m", "--url", url, "--timeout", "5s",
            "--state-dir", str(tmp_path), check=0)
    assert Recorder.seen == [("/health?probe=1", f"127.0.0.1:{recorder}")] * 2


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/health#frag",
                                 "http://u@127.0.0.1:{port}/health",
                                 "http://127.0.0.1:99999/health"])
def test_both_hooks_refuse_what_the_generator_refuses(recorder: int, tmp_path: Path,
                                                      url: str) -> None:
    url = url.format(port=recorder)
    ready = run_cli("wait-ready", "--url", url, "--timeout", "2s")
    live = run_cli("liveness-probe", "--unit", "m", "--url", url, "--timeout", "1s",
                   "--state-dir", str(tmp_path))
    for done in (ready, live):
        assert done.returncode == 1 and "bad URL" in done.stderr, done
    assert Recorder.seen == []

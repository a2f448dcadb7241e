"""Property-based fuzzing (Debian's python3-hypothesis) of model files and
drop-in trees through the generator's main(): load, validate, render, write.

For every generated tree:
  - no exception escapes main(), and no failure is an "internal error";
  - the known-good model beside the fuzzed ones is still generated;
  - every fuzzed model either got a unit or a log line naming its file;
  - every log line is one line.
Then every unit written over the whole run passes `systemd-analyze verify`
(one call for all of them: verify is slow to start).

Raw [unit]/[service] values are passed through verbatim, so their meaning is
systemd's to judge: the fuzzer gives them values systemd accepts plus every
kind of line-breaking text, which must be refused."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# Hypothesis caches Unicode tables under ./.hypothesis: not in the checkout.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "infer-units-hypothesis"))

from infer_units.generator.errors import one_line  # noqa: E402
from infer_units.generator.main import main  # noqa: E402

GOOD = 'engine = "command"\ncommand = ["/opt/srv/serve", "--good"]\ngpus = [7]\n'
MAX_EXAMPLES = int(os.environ.get("INFER_UNITS_FUZZ_EXAMPLES", "150"))

# ---------------------------------------------------------------- values

SPECIAL_TEXT = [
    "", " ", "\n", "\r", "\r\n", "\t", "\\", "a\\", "\\\\", "%", "%n", "%%", "$HOME", "${X}",
    "\x00", "\x1b", "\x7f", "\u2028", "\u0085", "١٢", "١٢s", "12", "0", "-1", "10s", "1h 30min",
    "500ms", "1us", "nan", "inf", "-x", "--flag", "a:b", "@x", "x@y", '"', "'", "#", ";", "[", "=",
    "/opt/x/bin/python", "venv/bin/python", "./x", "python3", "/..", "/opt//x", "/opt/x/",
    "http://127.0.0.1:8000/health", "https://h/x y", "notaurl", "GPU-deadbeef-0000-1111",
    "0000:41:00.0", "41:00.0", "all", "sglang", "vllm", "command", "tgi", "llamacpp", "trtllm",
    "kill", "wait", "fail", "on", "off", "auto", "root", "inference", "_svc", "a.b", "65535",
    "ü模🚀", "9" * 400 + "s", "99999999999d", "1.2.3s", "multi-user.target", "../../x.target",
]
text = st.one_of(
    st.sampled_from(SPECIAL_TEXT),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.lists(st.sampled_from(SPECIAL_TEXT), min_size=2, max_size=4).map("".join),
)
ints = st.one_of(st.integers(-3, 70000), st.integers(),
                 st.sampled_from([2 ** 31, 2 ** 63 - 1, 2 ** 63, -2 ** 63 - 1, 10 ** 30, 10 ** 200]))
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(text, ints, floats, st.booleans())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(text, inner, max_size=3), max_leaves=6)


@st.composite
def deep(draw: st.DrawFn) -> object:
    value: object = draw(scalars)
    for _ in range(draw(st.integers(1, 40))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


anything = st.one_of(scalars, values, deep())

# Plausible values per key, so that many fuzzed models are accepted (and verified).
PLAUSIBLE = {
    "engine": st.sampled_from(["sglang", "vllm", "trtllm", "tgi", "llamacpp", "command"]),
    "model": st.sampled_from(["/models/m", "org/model", "/m/x.gguf", "/m/with space", "/m/100%"]),
    "gpus": st.one_of(st.lists(st.integers(8, 15), min_size=1, max_size=3, unique=True),
                      st.just("all")),
    "port": st.integers(1, 65535),
    "host": st.sampled_from(["127.0.0.1", "0.0.0.0", "::", "::1", "gpu-a.example"]),
    "tensor-parallel": st.integers(1, 4),
    "args": st.lists(text, max_size=4),
    "command": st.lists(text, max_size=3).map(lambda rest: ["/opt/srv/serve", *rest]),
    "python": st.sampled_from(["/usr/bin/python3", "/opt/v env/bin/python", "python3"]),
    "executable": st.sampled_from(["llama-server", "/opt/tgi/bin/launcher"]),
    "user": st.sampled_from(["inference", "_svc-1", "1000"]),
    "description": text,
}
SUBKEYS = {
    "env": st.one_of(st.sampled_from(["A", "B_2", "_C", "CUDA_VISIBLE_DEVICES"]), text),
    "nccl": st.one_of(st.sampled_from(["p2p", "socket-ifname", "NCCL_DEBUG", "ib-hca"]), text),
    "reap": st.sampled_from(["foreign", "term-grace", "timeout", "ignore", "bogus"]),
    "ready": st.sampled_from(["url", "timeout", "interval", "bogus"]),
    "unit": st.sampled_from(["Description", "After", "Documentation", "bad key"]),
    "service": st.sampled_from(["Nice", "TimeoutStopSec", "LimitNOFILE", "ExecStartPost"]),
    "install": st.sampled_from(["WantedBy", "RequiredBy", "Alias"]),
}
SUBVALUES = {
    "nccl.p2p": st.sampled_from(["on", "off", "auto"]),
    "reap.foreign": st.sampled_from(["kill", "wait", "fail"]),
    "reap.ignore": st.lists(text, max_size=2),
    "ready.url": st.sampled_from(["http://127.0.0.1:9/health", "https://[::1]:8/x"]),
    "unit.Description": st.sampled_from(["a b ü", "x"]),
    "unit.After": st.sampled_from(["network.target", "a.service b.service"]),
    "unit.Documentation": st.sampled_from(["https://example.org/doc", "man:x(1)"]),
    "service.Nice": st.sampled_from([5, -3, "10"]),
    "service.TimeoutStopSec": st.sampled_from(["90s", "2min", 30]),
    "service.LimitNOFILE": st.sampled_from([65536, "infinity"]),
    "service.ExecStartPost": st.sampled_from(["/bin/true", "-/usr/bin/env x", '/bin/echo "a b"']),
    "install.WantedBy": st.sampled_from(["multi-user.target", ["a.target", "b.target"]]),
    "install.RequiredBy": st.sampled_from(["graphical.target"]),
}
LINE_BREAKERS = st.sampled_from(["x\ny", "x\rExecStartPre=/bin/evil", "x\\", "x\x00", "\x1b[0m",
                                 "a\u2028b", "ends\\\\"])
DURATIONS = st.one_of(st.sampled_from(["10s", "2min", "1h 30min", "500ms", "1us", "3650d", 0, 5,
                                       0.001, 1.5]), text, floats, ints)


def subvalue(table: str, key: str) -> st.SearchStrategy:
    plausible = SUBVALUES.get(f"{table}.{key}")
    if table in ("unit", "service", "install"):
        return st.one_of(plausible, LINE_BREAKERS) if plausible is not None else LINE_BREAKERS
    if key in ("timeout", "term-grace", "interval"):
        return DURATIONS
    if plausible is not None:
        return st.integers(0, 3).flatmap(lambda i: anything if i == 3 else plausible)
    return st.one_of(text, scalars, anything)


@st.composite
def table(draw: st.DrawFn, name: str) -> dict:
    keys = draw(st.lists(SUBKEYS[name], max_size=3, unique=True))
    return {k: draw(subvalue(name, k)) for k in keys}


@st.composite
def model(draw: st.DrawFn) -> dict:
    engine = draw(PLAUSIBLE["engine"])
    data: dict = {"engine": engine}
    if engine == "command":
        data["command"] = ["/opt/srv/serve"]
    else:
        data["model"] = "/models/m"
        data["port"] = draw(st.integers(1024, 65535))
    data["gpus"] = [draw(st.integers(8, 200))]
    keys = [*PLAUSIBLE, *SUBKEYS] * 3 + ["bogus", "reap.x"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        if key in SUBKEYS:
            data[key] = draw(table(key))
        elif key in PLAUSIBLE and draw(st.integers(0, 4)) < 4:
            data[key] = draw(PLAUSIBLE[key])
        else:
            data[key] = draw(anything)
    return data


# ---------------------------------------------------------------- TOML writing

BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(k: str) -> str:
    return k if k and BARE.issuperset(k) else toml_str(k)


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return hex(v) if v > 10 ** 50 else str(v)
    if isinstance(v, float):
        return "nan" if v != v else "inf" if v == float("inf") else "-inf" if v == float("-inf") \
            else repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(data: dict) -> str:
    head = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [f"[{toml_key(k)}]\n" + "".join(f"{toml_key(sk)} = {toml_value(sv)}\n"
                                              for sk, sv in v.items())
              for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(head) + "\n" + "".join(tables)


# ---------------------------------------------------------------- trees

NAME_CHARS = st.sampled_from(list("abcxyz019_-.") + [":", "@", "%", " ", "\n", "é", "\\", "\udcff"])
SAFE_NAME_CHARS = st.sampled_from(list("abcxyz019_-."))
VALID_NAMES = st.one_of(st.sampled_from(["m1", "m2", "m3", "m4"]),
                        st.lists(SAFE_NAME_CHARS, min_size=1, max_size=8).map(
                            lambda c: "v" + "".join(c)))
HOSTILE_NAMES = st.one_of(st.sampled_from(["ssh", "defaults"]),
                          st.lists(NAME_CHARS, min_size=1, max_size=8).map(
                              lambda c: "f-" + "".join(c)))
# Mostly valid names, so that most trees reach validation and rendering.
# (Hypothesis favours small integers: 0..3 are the common case here.)
names = st.integers(0, 4).flatmap(lambda i: HOSTILE_NAMES if i == 4 else VALID_NAMES)
FILE_KINDS = st.integers(0, 4).flatmap(
    lambda i: st.sampled_from(["bytes", "mutated", "empty", "devnull", "dir", "fifo", "loop"])
    if i == 4 else st.just("toml"))
# 'd' for drop-in file names: anything a file name can be.
DROPIN_NAMES = st.one_of(st.sampled_from(["50-a.toml", "10-b.toml"]),
                         st.lists(NAME_CHARS, min_size=1, max_size=6).map(
                             lambda c: "".join(c) + ".toml"))


@st.composite
def content(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(FILE_KINDS)
    body = to_toml(draw(model())).encode()
    if kind == "bytes":
        body = draw(st.binary(max_size=64))
    elif kind == "mutated":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(max_size=8)) + body[at + draw(st.integers(0, 4)):]
    return kind, body


@st.composite
def dropin(draw: st.DrawFn) -> tuple[str, str, bytes]:
    kind, body = draw(content())
    partial = {k: v for k, v in draw(model()).items() if draw(st.booleans())}
    return draw(DROPIN_NAMES), kind, to_toml(partial).encode() if kind == "toml" else body


trees = st.lists(st.tuples(names, content(), st.lists(dropin(), max_size=2)), min_size=1,
                 max_size=4, unique_by=lambda t: t[0])


def place(path: Path, kind: str, body: bytes) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "devnull":
        path.symlink_to("/dev/null")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.name)
    else:
        path.write_bytes(body)


def _files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                      p.read_text(encoding="utf-8") if p.is_file() else "dir")
            for p in sorted(out.rglob("*"))}


def test_fuzzed_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collected = tmp_path / "collected"
    collected.mkdir()
    units_dir = tmp_path / "system-units"
    units_dir.mkdir()
    (units_dir / "ssh.service").write_text("[Service]\nExecStart=/usr/sbin/sshd\n")
    monkeypatch.setenv("INFER_UNITS_UNIT_PATH", str(units_dir))
    monkeypatch.setenv("SYSTEMD_LOG_TARGET", "console")
    monkeypatch.setenv("SYSTEMD_LOG_LEVEL", "info")
    rerun = [0]
    counter = itertools.count()
    accepted = [0]
    examples = [0]

    # CI replays the same examples every run (a red CI from a new random find
    # would block unrelated work); by hand, each run explores new ones.

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              derandomize=bool(os.environ.get("CI")),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(trees)
    def run(tree: list) -> None:
        examples[0] += 1
        work = Path(tempfile.mkdtemp(dir=tmp_path))
        try:
            etc = work / "etc"
            out = work / "out"
            etc.mkdir()
            out.mkdir()
            (etc / "good.toml").write_text(GOOD)
            for name, (kind, body), dropins in tree:
                place(etc / f"{name}.toml", kind, body)
                if dropins and name != "defaults":    # host-wide defaults may refuse any model
                    ddir = etc / f"{name}.toml.d"
                    ddir.mkdir()
                    for dname, dkind, dbody in dropins:
                        if not (ddir / dname).exists() and not (ddir / dname).is_symlink():
                            place(ddir / dname, dkind, dbody)
            os.environ["INFER_UNITS_CONFIG_PATH"] = str(etc)
            log = io.StringIO()
            with contextlib.redirect_stderr(log):
                assert main([str(out)]) == 0
            lines = log.getvalue().splitlines()
            assert (out / "good.service").exists(), lines
            if not lines and examples[0] % 10 == 0:
                # Run again, the same tree writes the same files, byte for byte.
                again = work / "again"
                again.mkdir()
                assert main([str(again)]) == 0
                assert _files(again) == _files(out)
                rerun[0] += 1
            assert not [l for l in lines if "internal error" in l], lines
            assert all(l.startswith("infer-units-generator: ") for l in lines), lines
            for name, (kind, body), _ in tree:
                if kind in ("empty", "devnull") or (kind in ("toml", "bytes", "mutated")
                                                    and not body):
                    continue            # masked
                named = one_line(f"{etc}/{name}.toml")
                assert (out / f"{name}.service").exists() or any(
                    named in l or one_line(f"{etc}/{name}.toml.d") in l for l in lines), \
                    (name, lines)
            for unit in out.glob("*.service"):
                if unit.name == "good.service" and accepted[0]:
                    continue        # the same unit every time: verify it once
                accepted[0] += 1
                shutil.copy(unit, collected / f"fz{next(counter):04d}-{unit.name}")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    run()
    units = sorted(collected.glob("*.service"))
    print(f"fuzz: {examples[0]} examples, {len(units)} units to verify, "
          f"{rerun[0]} clean trees generated twice")
    # Enough accepted models that verify means something (the good one counts once).
    assert len(units) > MAX_EXAMPLES // 10, len(units)
    if shutil.which("systemd-analyze") and Path("/usr/lib/systemd/system").is_dir():
        from .test_verify import assert_verify_clean, make_verify_root
        verify_root = make_verify_root(tmp_path / "verify-root")
        assert_verify_clean(verify_root, units, f"{len(units)} fuzzed units")

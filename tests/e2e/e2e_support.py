"""Model files and the fake GPU table for the end-to-end tests and bench/restart_bench.py."""

from __future__ import annotations

import json
import shlex
import tomllib

from ..support import wait_until  # noqa: F401  (the tests' one wait helper, re-exported)

FAKE_GPU_COUNT = 6
FAKE_TABLE = "/etc/infer-units/fakegpus.json"


# The root-owned file that marks a host for tests: only there do the root hooks
# honour INFER_UNITS_* test variables (the fake GPU table) from a unit's [env]
# (helpers/hookenv.py).  A real host has none.
HOOKS_TEST_MARKER = "/etc/infer-units/hooks-test-mode"


def install_fake_gpus(box) -> None:
    """The fake GPU table, its device files, and the test marker."""
    box.write(FAKE_TABLE, fake_gpu_table())
    box.write(HOOKS_TEST_MARKER, "this host runs infer-units' tests: the hooks honour "
              "INFER_UNITS_* test variables\n")
    box.sh("mkdir -p /var/lib/fakegpu && for i in $(seq 0 %d); do : > /var/lib/fakegpu/nvidia$i; "
           "done" % (FAKE_GPU_COUNT - 1))


def fake_gpu_table() -> str:
    return json.dumps({"gpus": [
        {"index": i, "uuid": f"GPU-e2e{i:05d}-0000-0000-0000-{i:012d}",
         "pci": f"0000:{0x41 + i:02x}:00.0", "device": f"/var/lib/fakegpu/nvidia{i}",
         "memory_mib": 143771} for i in range(FAKE_GPU_COUNT)]})


def model_toml(name: str, gpus: list[int], port: int, extra_args: list[str] | None = None,
               env: dict[str, str] | None = None, reap: str = "", ready_timeout: str = "60s",
               load: float = 1.0) -> str:
    argv = ["/usr/local/bin/fake-engine", "--port", str(port), "--load", str(load),
            *(extra_args or [])]
    lines = ['engine = "command"', f"command = {json.dumps(argv, ensure_ascii=False)}", f"gpus = {gpus}",
             f"port = {port}", "", "[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"']
    for k, v in (env or {}).items():
        lines.append(f"{k} = {json.dumps(v, ensure_ascii=False)}")
    lines += ["", "[reap]", 'term-grace = "1s"', 'timeout = "15s"', reap,
              "", "[ready]", f'timeout = "{ready_timeout}"', 'interval = "100ms"',
              "", "[service]", 'RestartSec = "1s"']
    return "\n".join(lines) + "\n"


FAKES = {"fake-engine": "/usr/local/bin/fake-engine", "fake-python": "/usr/local/bin/fake-python",
         "fake-tgi": "/usr/local/bin/fake-tgi",
         "fake-llama-server": "/usr/local/bin/fake-llama-server"}


def install_fakes(box, root) -> None:
    """The fake engines under the names that pick their personality, and the
    CPU stand-in for torch that fake-python puts on the path."""
    source = (root / "tests/e2e/fake_engine.py").read_text()
    for path in FAKES.values():
        box.write(path, source, mode=0o755)
    box.write("/usr/local/lib/fake-torch/torch/__init__.py",
              (root / "tests/fake_torch/torch/__init__.py").read_text())


def engine_toml(name: str, engine: str, gpus: list[int], port: int, *, env: dict[str, str]
                | None = None, p2p: str = "on", ready: str = "", extra: str = "") -> str:
    """A model of a real engine kind whose interpreter or binary is its fake."""
    lines = [f'engine = "{engine}"', f'model = "/models/{name}"', f"gpus = {gpus}",
             f"port = {port}"]
    if engine in ("sglang", "vllm", "trtllm"):
        lines.append(f'python = "{FAKES["fake-python"]}"')
    elif engine == "tgi":
        lines.append(f'executable = "{FAKES["fake-tgi"]}"')
    elif engine == "llamacpp":
        lines.append(f'executable = "{FAKES["fake-llama-server"]}"')
    lines.append(extra)
    lines += ["[env]", f'INFER_UNITS_FAKE_GPUS = "{FAKE_TABLE}"',
              f'FAKE_RECORD = "/run/{name}.json"']
    for k, v in (env or {}).items():
        lines.append(f"{k} = {json.dumps(v)}")
    lines += ["[nccl]", f'p2p = "{p2p}"',
              "[reap]", 'term-grace = "1s"', 'timeout = "15s"',
              "[ready]", 'timeout = "60s"', ready,
              "[service]", 'RestartSec = "1s"']
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- reading the box

def show(box, unit: str, *props: str) -> dict[str, str]:
    out = box.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def holders(box, gpus: str) -> list[dict]:
    out = box.sh(f"INFER_UNITS_FAKE_GPUS=/etc/infer-units/fakegpus.json "
                 f"infer-units holders --json --gpus {gpus}").stdout
    return json.loads(out)["holders"]


def health_status(box, port: int, timeout: float | None = None) -> str:
    """The HTTP status 127.0.0.1:PORT/health answers inside the container
    ("200"), asked from there (the container has its own network); "" when it
    answers no 2xx or 3xx, or nothing answers within `timeout` (None: wait)."""
    done = box.sh(f"python3 -c \"import urllib.request as u; "
                  f"print(u.urlopen('http://127.0.0.1:{port}/health', timeout={timeout!r}).status)\"",
                  check=False)
    return done.stdout.strip()


def alive(box, pid: int) -> bool:
    state = box.sh(f"cat /proc/{pid}/stat 2>/dev/null || true").stdout
    return bool(state) and state.rsplit(")", 1)[1].split()[0] != "Z"


def add_model(box, name: str, text: str, model_present: bool = True) -> None:
    """The model file, and the model's path (an absolute `model`) made in the
    box as a directory where nothing is there yet: pre-start refuses a model
    whose path is missing.  `model_present=False` leaves it missing."""
    box.write(f"/etc/infer-units/{name}.toml", text)
    path = tomllib.loads(text).get("model")
    if model_present and isinstance(path, str) and path.startswith("/"):
        make_model_path(box, path)


def make_model_path(box, path: str) -> None:
    """The model's path, as a directory, unless something is there already."""
    quoted = shlex.quote(path)
    box.sh(f"test -e {quoted} || mkdir -p {quoted}")



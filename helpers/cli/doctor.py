"""`infer-units doctor`: every host and GPU check (health.py), and per model
what decides whether it will start: its file (as `check`), its GPUs exist
and are healthy, its port is free, its interpreter or server binary runs and
finds the engine, and the driver supports the engine's CUDA runtime.

It reads; it does not stress (no allocation, no peer copy: that is the P2P
self-test's job at start).  The model's code is never run as root: the
engine probe runs the model's `python` as the model's `user` (nobody when
the file names none), and it only *locates* the engine and reads versions as
data (torch/version.py as text, the nvidia-cuda-runtime dist metadata)
unless --import asks for a real import.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from typing import Any

import click

from ..jsonout import echo_json
from .options import complete_model_names
from ..decide.health import ERROR, OK, UNKNOWN, WARNING, Finding, Report, check_gpus, worst
from ..facts.untrusted import escaped, run_untrusted

SCHEMA_VERSION = 1
PROBE_TIMEOUT_S = 30.0
IMPORT_TIMEOUT_S = 300.0
PROBE_OUTPUT_MAX = 1 << 16

# Run by the model's python, as the model's user.  Prints one JSON line.
# Versions are read as data: importing torch would load CUDA's libraries.
_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, re, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
mod = sys.argv[1]
try:
    spec = iu.find_spec(mod.split(".")[0])
except Exception as e:
    spec, out["engine_error"] = None, f"{type(e).__name__}: {e}"
out["engine_found"] = spec is not None
out["engine_origin"] = getattr(spec, "origin", None) if spec else None
if spec is not None and sys.argv[2] == "import":
    try:
        __import__(mod)
        out["engine_imported"] = True
    except BaseException as e:
        out["engine_imported"] = False
        out["engine_error"] = f"{type(e).__name__}: {e}"[:500]
cuda = None
try:
    t = iu.find_spec("torch")
    if t and t.submodule_search_locations:
        text = open(list(t.submodule_search_locations)[0] + "/version.py").read()
        m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
        if m:
            cuda, out["cuda_from"] = m.group(1), "torch/version.py"
        out["torch"] = (re.search(r"^__version__\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)", text, re.M)
                        or [None, None])[1]
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"[:300]
if cuda is None:
    for dist in ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime",
                 "nvidia-cuda-runtime-cu11"):
        try:
            cuda, out["cuda_from"] = md.version(dist), dist
            break
        except Exception:
            pass
out["cuda_runtime"] = cuda
print(json.dumps(out))
"""


def _model_finding(check: str, level: str, fact: str, fix: str = "", source: str = "",
                   gpu: int | None = None, uuid: str | None = None) -> Finding:
    return Finding(check, level, fact, fix if level != OK else "", source, gpu, uuid)


# ------------------------------------------------------------------ running as the user

def _account(user: str | None) -> tuple[pwd.struct_passwd | None, str]:
    """Whom the probe runs as: the model's user; nobody when it names none
    (the model runs as root then, but its files may be anyone's); ourselves
    when we are not root (we cannot switch, and run nothing as root)."""
    if os.geteuid() != 0:
        return None, "the caller (not root)"
    name = user or "nobody"
    try:
        return pwd.getpwnam(name), name
    except KeyError:
        raise LookupError(f"user {name!r} does not exist") from None


def run_as(user: str | None, argv: list[str], env: dict[str, str],
           timeout: float) -> subprocess.CompletedProcess[str]:
    account, _who = _account(user)
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    base["HOME"] = account.pw_dir if account is not None else os.environ.get("HOME", "/")
    # The model's python prints what it likes, as long as it likes: bounded
    # pieces within the timeout (facts/untrusted.py), as the P2P self-test.
    ran = run_untrusted(argv, timeout, {**base, **env}, account, [])
    if ran.timed_out:
        raise subprocess.TimeoutExpired(argv, timeout)
    return subprocess.CompletedProcess(argv, ran.returncode or 0, ran.stdout, ran.stderr)


def _who(user: str | None) -> str:
    return user if os.geteuid() == 0 and user else (
        "nobody" if os.geteuid() == 0 else "the caller")


# ------------------------------------------------------------------ per model

def _cuda_number(text: str) -> int | None:
    """"12.8" / "12.8.90" -> 12080 (NVML's encoding: 1000 * major + 10 * minor)."""
    parts = text.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]) * 1000 + int(parts[1]) * 10


def _show_cuda(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def cuda_finding(runtime: str | None, driver: dict[str, Any], why_no_runtime: str) -> Finding:
    supported = driver.get("cuda")
    if runtime is None:
        return _model_finding("cuda-driver", UNKNOWN, why_no_runtime or "no CUDA runtime found "
                              "(neither torch/version.py nor an nvidia-cuda-runtime package)")
    wanted = _cuda_number(runtime)
    if supported is None or wanted is None:
        reason = driver.get("why") or "the driver's CUDA version is not known"
        return _model_finding("cuda-driver", UNKNOWN, f"runtime CUDA {runtime}; {reason}")
    fact = f"the engine's CUDA runtime {runtime}, the driver supports CUDA {_show_cuda(supported)}"
    source = "nvmlSystemGetCudaDriverVersion_v2"
    if wanted // 1000 > supported // 1000:
        return _model_finding("cuda-driver", ERROR, fact + ": the runtime is newer (another "
                              "major version): CUDA will not initialize",
                              "install a driver for CUDA " + runtime.rsplit(".", 1)[0] +
                              ", or the engine's build for CUDA " + _show_cuda(supported), source)
    if wanted > supported:
        return _model_finding("cuda-driver", WARNING, fact + ": the runtime is newer (same "
                              "major: CUDA's minor version compatibility runs it, but PTX JIT "
                              "and newer features fail)",
                              "update the driver, or the engine's build for CUDA "
                              + _show_cuda(supported), source)
    return _model_finding("cuda-driver", OK, fact, source=source)


def _engine_findings(model: Any, driver: dict[str, Any], do_import: bool) -> list[Finding]:
    from ...generator.engines import ENGINE_SPECS
    spec = ENGINE_SPECS[model.engine]
    who = _who(model.user)
    if spec.module is None:
        return _binary_findings(model, spec, who)
    python = model.python
    if not os.path.isabs(python):
        python = shutil.which(python) or python
    try:
        done = run_as(model.user, [python, "-c", _PROBE, spec.module,
                                   "import" if do_import else "find"],
                      dict(model.env), IMPORT_TIMEOUT_S if do_import else PROBE_TIMEOUT_S)
    except LookupError as e:
        return [_model_finding("python", ERROR, str(e), "create the user, or fix `user`")]
    except subprocess.TimeoutExpired as e:
        return [_model_finding("python", ERROR, f"{python} as {who}: no answer in {e.timeout:g}s")]
    except OSError as e:
        return [_model_finding("python", ERROR, f"{python} as {who}: {e.strerror}",
                               "fix `python` in the model file (an interpreter with the engine "
                               "installed)")]
    lines = [ln for ln in done.stdout[-PROBE_OUTPUT_MAX:].split("\n") if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().split("\n") or ["no output"])[-1][:300]
        return [_model_finding("python", ERROR, f"{python} as {who} exited "
                               f"{done.returncode}: {tail}", "fix `python` in the model file")]
    try:
        got = escaped(json.loads(lines[-1]))
    except ValueError:
        return [_model_finding("python", ERROR, f"{python} as {who}: unreadable answer")]
    if not isinstance(got, dict):
        return [_model_finding("python", ERROR, f"{python} as {who}: unreadable answer")]
    found = [_model_finding("python", OK, f"{python} (Python {got.get('python')}) runs as {who}")]
    top = spec.module.split(".")[0]
    if not got.get("engine_found"):
        found.append(_model_finding("engine", ERROR, f"{python} cannot find {top} "
                                    f"({got.get('engine_error', 'not installed')})",
                                    f"install {model.engine} into that environment "
                                    f"(`{python} -m pip install {top}`), or point `python` "
                                    "at the one that has it"))
    elif do_import and not got.get("engine_imported"):
        found.append(_model_finding("engine", ERROR, f"import {spec.module} failed: "
                                    f"{got.get('engine_error')}", "fix that environment"))
    else:
        verb = "imports" if do_import else "is installed at"
        found.append(_model_finding("engine", OK, f"{spec.module} {verb} "
                                    f"{got.get('engine_origin') or ''}".strip()))
    runtime = got.get("cuda_runtime") if isinstance(got.get("cuda_runtime"), str) else None
    found.append(cuda_finding(runtime, driver, ""))
    return found


def _binary_findings(model: Any, spec: Any, who: str) -> list[Finding]:
    """tgi, llamacpp: the server binary runs (`--version`, as the user);
    command: its argv[0] exists and is executable (running it would start
    the server)."""
    if model.engine == "command":
        program = model.command[0]
    else:
        program = model.executable or spec.default_executable
    path = program if os.path.isabs(program) else shutil.which(program, path="/usr/local/sbin:"
                                                               "/usr/local/bin:/usr/sbin:/usr/bin")
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        return [_model_finding("executable", ERROR, f"{program}: not found or not executable",
                               "install it, or set `executable` (`command`) to its full path")]
    if model.engine == "command":
        return [_model_finding("executable", OK, f"{path} is executable (not run: it is the "
                               "server)")]
    try:
        done = run_as(model.user, [path, "--version"], dict(model.env), PROBE_TIMEOUT_S)
    except LookupError as e:
        return [_model_finding("executable", ERROR, str(e), "create the user, or fix `user`")]
    except (OSError, subprocess.TimeoutExpired) as e:
        return [_model_finding("executable", ERROR, f"{path} --version as {who}: {e}")]
    answer = (done.stdout.strip() or done.stderr.strip()).split("\n")[:1]
    if done.returncode != 0:
        return [_model_finding("executable", ERROR, f"{path} --version as {who} exited "
                               f"{done.returncode}: {(answer or [''])[0][:200]}")]
    return [_model_finding("executable", OK, f"{path} runs as {who}: "
                           f"{(answer or [''])[0][:200]}")]


def _port_finding(model: Any) -> Finding | None:
    if model.port is None or "port" not in model.ports:
        return None
    from ..facts.ports import can_bind, port_users
    users = port_users(model.host, model.port)
    holders = None if users is None else [info for info, _how in users]
    from ..decide.identity import in_unit      # by systemd's ControlGroup, never a cgroup's name
    own = [h for h in holders or [] if in_unit(h.cgroup, model.unit_name)]
    if holders and len(own) == len(holders):
        return _model_finding("port", OK, f"port {model.port} is held by {model.unit_name} "
                              "itself (running)")
    if holders:
        return _model_finding("port", ERROR, f"port {model.port} is taken: "
                              + "; ".join(f"{info.describe()[:200]} ({how})"
                                          for info, how in users or []),
                              "stop that process, or give the model another `port`")
    if holders is None or not can_bind(model.host, model.port):
        return _model_finding("port", ERROR, f"port {model.port} is taken by a process out of "
                              "sight (another network namespace, or run as root to see it)",
                              "give the model another `port`, or free it")
    return _model_finding("port", OK, f"port {model.port} on {model.host} is free")


def model_findings(model: Any, backend: Any, every: list[Any], health: Report | None,
                   driver: dict[str, Any], do_import: bool) -> list[Finding]:
    from ..facts.gpus import GpuError, select
    found: list[Finding] = [_model_finding("model-file", OK, f"{model.main_path} -> "
                                           f"{model.unit_name}")]
    selector = model.gpu_selector()
    if selector is not None:
        if backend is None:
            found.append(_model_finding("gpus", UNKNOWN, "no GPUs can be listed here"))
        else:
            try:
                chosen = select(every, selector)
                found.append(_model_finding("gpus", OK, "GPU " + ", ".join(
                    f"{g.index} ({g.uuid})" for g in chosen)))
                accepted = set(model.health_accept)
                for g in chosen:
                    mine = health.of_gpu(g.index) if health else []
                    bad = [f for f in mine if f.level == ERROR and f.check not in accepted]
                    if bad:
                        found.append(_model_finding(
                            "gpu-health", ERROR, f"GPU {g.index}: " + ", ".join(
                                f"{f.check} ({f.fact})" for f in bad) + ": its start is refused",
                            "; ".join(f.fix for f in bad if f.fix) + "; or accept the check "
                            "in the model file: [health] accept = ["
                            + ", ".join(f'"{f.check}"' for f in bad) + "]", gpu=g.index,
                            uuid=g.uuid))
                    else:
                        found.append(_model_finding("gpu-health", OK, f"GPU {g.index}: no "
                                                    "error-level finding" + (
                                                        " (accepted: " + ", ".join(sorted(
                                                            accepted)) + ")" if accepted
                                                        else ""), gpu=g.index, uuid=g.uuid))
            except GpuError as e:
                found.append(_model_finding("gpus", ERROR, str(e), "fix `gpus` in the model "
                                            "file (`infer-units holders` lists the GPUs)"))
    port = _port_finding(model)
    if port is not None:
        found.append(port)
    found += _engine_findings(model, driver, do_import)
    return found


# ------------------------------------------------------------------ the report

def nvml_source() -> str | None:
    """Where nvidia-ml-py comes from: the copy the .deb bundles, one installed
    beside us, or None (then the /proc fallback answers)."""
    import importlib.util
    try:
        if importlib.util.find_spec("infer_units._vendor.pynvml") is not None:
            return "bundled with the package"
    except ImportError:
        pass
    spec = importlib.util.find_spec("pynvml")
    if spec is not None:
        return f"installed: {spec.origin}"
    return None


def backend_detail(name: str | None, error: str | None) -> str:
    """Which GPU backend answers and why, in words (doctor's first line)."""
    source = nvml_source()
    if name == "fake":
        return "fake (INFER_UNITS_FAKE_GPUS: a test table, not the GPUs)"
    if name == "nvml":
        return f"NVML (nvidia-ml-py {source})"
    if name == "proc":
        why = ("nvidia-ml-py is neither bundled nor installed" if source is None else
               f"nvidia-ml-py {source}, but NVML did not start (no libnvidia-ml, or the "
               "driver not loaded)")
        return (f"/proc fallback ({why}; which GPU a process uses is a hint from its "
                "CUDA_VISIBLE_DEVICES)")
    return f"none ({error or 'no GPUs found'})"


def collect(names: list[str], root: str | None = None, do_import: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    from ..facts.gpus import GpuError, backend
    b = None
    try:
        b = backend()
        every = b.gpus()
        health: Report | None = check_gpus(b, every, root, every=every)
        host_gpu_error = None
    except GpuError as e:
        every, health, host_gpu_error = [], None, str(e)
    findings = list(health.findings) if health else []
    if host_gpu_error:
        findings.insert(0, Finding("gpus", ERROR, host_gpu_error,
                                   "load the NVIDIA driver (modprobe nvidia), or install it",
                                   "NVML, /proc/driver/nvidia"))
    driver = health.driver if health else {"version": None, "cuda": None, "why": host_gpu_error}
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "backend": b.name if b else None,
        "backend_detail": backend_detail(b.name if b else None, host_gpu_error),
        "driver": driver,
        "gpus": [{"index": g.index, "uuid": g.uuid, "pci": g.pci,
                  "findings": [f.as_json() for f in findings if f.gpu == g.index]}
                 for g in every],
        "host": [f.as_json() for f in findings if f.gpu is None],
        "models": [], "errors": [], "unknown": [],
    }
    if names:
        from ...generator.build import load_all, render_checked
        from ...generator.errors import ConfigError
        from .status import unknown_names
        loaded = load_all(names)
        report["unknown"] = unknown_names(names, loaded)
        for problem in loaded.errors:
            report["errors"].append(str(problem))
        for model in loaded.models:
            try:
                render_checked(model)
            except ConfigError as e:
                report["errors"].append(str(e))
                report["models"].append({"name": model.name, "findings": [
                    _model_finding("model-file", ERROR, str(e)).as_json()]})
                continue
            mine = model_findings(model, b, every, health, driver, do_import)
            report["models"].append({"name": model.name, "unit": model.unit_name,
                                     "findings": [f.as_json() for f in mine]})
        for problem in loaded.errors:
            findings.append(_model_finding("model-file", ERROR, str(problem)))
        # Two models on one GPU or port alternate (both units exist; the second
        # start is refused while the first holds it): worth knowing, no error.
        for problem in loaded.conflicts:
            shared = _model_finding("shared", WARNING, str(problem), "fine for models that "
                                    "alternate; else give each its own GPUs and port").as_json()
            for entry in report["models"]:
                if entry["name"] in (problem.model, problem.other):
                    entry["findings"].append(shared)
        for entry in report["models"]:
            findings += [Finding(**f) for f in entry["findings"]]
    report["level"] = worst(findings)
    report["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    report["exit"] = exit_code(report)
    return report


def exit_code(report: dict[str, Any]) -> int:
    from ..exitcodes import BLOCKED, CLEAN, CONFIG_ERROR
    if report["unknown"]:
        return CONFIG_ERROR
    return BLOCKED if report["level"] == ERROR else CLEAN


def table(report: dict[str, Any], verbose: bool = False) -> str:
    """Text: one line per finding; ok lines only with --verbose, so problems stand out."""
    from .table import format_table
    rows = [("WHERE", "CHECK", "LEVEL", "FACT", "FIX")]

    def add(where: str, f: dict[str, Any]) -> None:
        if f["level"] == OK and not verbose:
            return
        rows.append((where, f["check"], f["level"], f["fact"], f["fix"] or "-"))
    for f in report["host"]:
        add("host", f)
    for g in report["gpus"]:
        for f in g["findings"]:
            add(f"GPU {g['index']}", f)
    for m in report["models"]:
        for f in m["findings"]:
            add(m["name"], f)
    lines = format_table(rows) if len(rows) > 1 else []
    counts: dict[str, int] = {}
    every = report["host"] + [f for g in report["gpus"] for f in g["findings"]] + \
        [f for m in report["models"] for f in m["findings"]]
    for f in every:
        counts[f["level"]] = counts.get(f["level"], 0) + 1
    summary = ", ".join(f"{counts[k]} {k}" for k in (ERROR, WARNING, UNKNOWN, OK) if k in counts)
    driver = report["driver"]
    lines.append(f"{len(report['gpus'])} GPU(s), backend {report['backend_detail']}, driver "
                 f"{driver.get('version') or 'version unknown'}"
                 + (f" (CUDA {_show_cuda(driver['cuda'])})" if driver.get("cuda") else "")
                 + f": {summary or 'nothing checked'} in {report['elapsed_ms']:.0f} ms"
                 + ("" if verbose else " (--verbose lists the ok ones)"))
    lines += [f"error: {e}" for e in report["errors"]]
    lines += [f"error: no model file named {n}.toml on the search path" for n in report["unknown"]]
    return "\n".join(lines)


# ------------------------------------------------------------------ the command


@click.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: every finding with its level, fact, fix and source.")
@click.option("--verbose", "-v", is_flag=True, help="List the ok findings too.")
@click.option("--import", "do_import", is_flag=True,
              help="With NAMES: import each engine (as the model's user) instead of only "
                   "locating it; takes as long as the engine's import (seconds).")
@click.option("--write-metrics", is_flag=True,
              help="Also store the GPU findings for the metrics file and `status` (root; "
                   "a timer running this keeps node_exporter's gauges fresh).")
@click.option("--root-dir", metavar="DIR", default=None,
              help="Read the kernel's /proc, /sys and /dev under DIR (a test's fake tree, a "
                   "copy taken from another host).  [default: /]")
def doctor(names: tuple[str, ...], as_json: bool, verbose: bool, do_import: bool,
           write_metrics: bool, root_dir: str | None) -> None:
    """Check the host, its GPUs and the models NAMES: what decides whether they start.

    Each finding is ok, warning, error or unknown (not readable here: never
    ok), with the fact read and the fix.  Exit 0 when no error, 2 when any
    check is an error (pre-start refuses a model's start on an error of its
    GPUs), 1 for an unknown name."""
    report = collect(list(names), root_dir, do_import)
    if write_metrics:
        from ..act.metrics import record_gpu_health
        from ..decide.health import Report
        every = report["host"] + [f for g in report["gpus"] for f in g["findings"]]
        record_gpu_health(Report([Finding(**f) for f in every], report["driver"]))
    if as_json:
        echo_json(report)
    else:
        click.echo(table(report, verbose))
    sys.exit(report["exit"])

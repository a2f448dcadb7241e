"""tools/check-engine-parsers: every SGLang and vLLM command line that the
tree's units carry, run through the engine's own argument parser.

Units: the golden units (tests/golden/*/*.service) and a fresh render of every
test case (tests/cases, each case as the generator tests lay it out), so the
check runs on what the tree renders now.  Each ExecStart= is read the way
systemd reads it (systemd_exec.py); a `$VAR` the env file sets at start (the
P2P verdict, INFER_UNITS_P2P_OFF_ARGS) is tried both ways: as the unit's
Environment= leaves it (P2P on) and with the off value the unit's pre-start
line writes (P2P off, with its environment too).  Each argv then runs in the
engine's venv through tools/engine_probe.py, which starts the unit's real
entry and stops it once its parser and configuration are done.

The engines' venvs: $INFER_UNITS_ENGINE_VENVS or --venvs when given (a
folder holding sglang/ and vllm/), else the cache that `tools/engines/build
parsers` fills under /var/cache/infer-units-engines (keyed by the pins in
tools/engine-venvs/*.txt), built here first when missing.

Exit status: 0 every argv accepted, 1 some argv rejected (or parsed against
what the unit means), 2 the check could not run (no venv, render failed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from systemd_exec import Exec, UnitError, environment, parse_unit, values, variables  # noqa: E402

TOOLS = Path(__file__).resolve().parent
PROBE = TOOLS / "engine_probe.py"
MARK = "@@infer-units-probe@@"
ENGINES = ("sglang", "vllm")
BUILD = TOOLS / "engines" / "build"
# The engines' wheels pin a CUDA torch of several GB; their parsers import
# torch but run on any build, and 2.13.0 is the CPU wheel this machine has.
TORCH = "torch==2.13.0"
P2P_VAR = "INFER_UNITS_P2P_OFF_ARGS"
P2P_FALLBACK = "--disable-custom-all-reduce"
LEVELS = ("run", "etc", "local", "lib")
PROBE_TIMEOUT_S = 300


class Unit:
    """One unit file whose ExecStart runs SGLang or vLLM."""

    def __init__(self, source: str, case: str, name: str, text: str) -> None:
        self.source, self.case, self.name = source, case, name
        sections = parse_unit(text)
        lines = values(sections, "Service", "ExecStart")
        self.exec = Exec(lines[-1], name) if lines else None
        self.env = environment(sections, name)
        self.pre = [Exec(v, name) for v in values(sections, "Service", "ExecStartPre")]
        self.has_env_file = bool(values(sections, "Service", "EnvironmentFile"))

    @property
    def engine(self) -> str | None:
        if self.exec is None:
            return None
        words = self.exec.words
        if "-m" in words[1:-1]:
            top = words[words.index("-m", 1) + 1].split(".")[0]
            return top if top in ENGINES else None
        base = os.path.basename(self.exec.executable)
        return base if base in ENGINES else None

    def other_engine(self) -> str:
        if self.exec is None:
            return "no ExecStart"
        words = self.exec.words
        return words[words.index("-m", 1) + 1] if "-m" in words[1:-1] \
            else os.path.basename(self.exec.executable)

    def _pre_option(self, option: str) -> list[str]:
        """Values of `option` on the infer-units pre-start line."""
        found: list[str] = []
        for pre in self.pre:
            words = pre.words
            for i, w in enumerate(words):
                if w == option and i + 1 < len(words):
                    found.append(words[i + 1])
                elif w.startswith(option + "="):
                    found.append(w[len(option) + 1:])
        return found

    def variants(self, extra: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        """(label, environment) for each way the env file can leave the argv."""
        assert self.exec is not None
        names = variables(self.exec.words) if self.exec.expand else []
        if not names:
            return [("-", dict(self.env))]
        off: dict[str, str] = {}
        for name in names:
            if name in extra:
                off[name] = extra[name]
            elif name == P2P_VAR:
                off[name] = " ".join(self._pre_option("--p2p-off-args")) or P2P_FALLBACK
        on_label = " ".join(f"{n}={self.env.get(n, '')!r}" if n in self.env else f"{n} unset"
                            for n in names)
        out = [(on_label, dict(self.env))]
        if off:
            # what pre-start writes to the env file when P2P is off
            env = dict(self.env, NCCL_P2P_DISABLE="1", **off)
            for assignment in self._pre_option("--p2p-off-env"):
                k, _, v = assignment.partition("=")
                env[k] = v
            out.append((" ".join(f"{n}={v!r}" for n, v in off.items()), env))
        return out


def case_names(cases: Path) -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in cases.iterdir()
                  if p.is_dir() or p.suffix == ".toml")


def render_cases(tree: Path, work: Path) -> tuple[list[Unit], list[str]]:
    """Every case through the tree's own generator, laid out as its tests do."""
    units: list[Unit] = []
    problems: list[str] = []
    cases = tree / "tests" / "cases"
    for case in case_names(cases):
        src = cases / case if (cases / case).is_dir() else cases / f"{case}.toml"
        root = work / "cases" / case
        if src.is_dir():
            shutil.copytree(src, root, symlinks=True)
            dirs = [str(root / lvl) for lvl in LEVELS if (root / lvl).is_dir()]
        else:
            (root / "etc").mkdir(parents=True)
            shutil.copy(src, root / "etc" / src.name)
            dirs = [str(root / "etc")]
        out = work / "out" / case
        out.mkdir(parents=True)
        # -B and no bytecode: the tree may be someone else's checkout (read-only use)
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1",
                   INFER_UNITS_CONFIG_PATH=":".join(dirs), SYSTEMD_LOG_TARGET="console")
        # the tests' host name, which the multi-node cases rank by (tests/support.py)
        env.setdefault("INFER_UNITS_HOSTNAME", "gpu-a.example")
        done = subprocess.run([sys.executable, "-B", "-m", "infer_units.generator.main", str(out)],
                              capture_output=True, text=True, env=env, timeout=120, cwd=work)
        if done.returncode != 0:
            problems.append(f"render {case}: exit {done.returncode}: "
                            + (done.stderr.strip().splitlines() or [""])[-1])
            continue
        for path in sorted(out.glob("*.service")):
            units.append(Unit("render", case, path.name, path.read_text(encoding="utf-8")))
    return units, problems


def golden_units(tree: Path) -> list[Unit]:
    return [Unit("golden", p.parent.name, p.name, p.read_text(encoding="utf-8"))
            for p in sorted((tree / "tests" / "golden").glob("*/*.service"))]


def venv_python(venvs: Path, engine: str) -> Path:
    return venvs / engine / "bin" / "python"


def probe(venvs: Path, engine: str, argv: list[str], env: dict[str, str],
          home: Path) -> dict[str, object]:
    """Run the engine's entry on argv; {"fields": ...} or {"error": ...}."""
    python = venv_python(venvs, engine)
    run_env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(home),
               "XDG_CACHE_HOME": str(home / "cache"), "LANG": "C.UTF-8",
               # no GPU here: vLLM builds its parser for the CPU platform
               # (same flags; only platform-dependent defaults differ)
               "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "SGLANG_DISABLE_REQUEST_LOGGING": "1", **env}
    try:
        done = subprocess.run([str(python), str(PROBE), json.dumps(argv)], capture_output=True,
                              text=True, env=run_env, timeout=PROBE_TIMEOUT_S, cwd=home)
    except subprocess.TimeoutExpired:
        return {"error": f"probe timed out after {PROBE_TIMEOUT_S}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    errors = [l for l in done.stderr.splitlines() if "error:" in l]
    tail = errors[-1] if errors else (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {done.returncode}: {tail.strip()}"}


def describe(engine: str, fields: dict[str, object]) -> str:
    keys = ["model", "tp", "host", "port", "disable_custom_all_reduce"]
    if fields.get("nnodes") not in (None, 1):
        keys += ["nnodes", "node_rank", "dist_init_addr" if engine == "sglang" else "master_addr"]
        if engine == "vllm":
            keys += ["master_port", "headless"]
    if engine == "vllm" and fields.get("shutdown_timeout"):
        keys.append("shutdown_timeout")
    short = {"disable_custom_all_reduce": "no_custom_ar"}
    return " ".join(f"{short.get(k, k)}={fields.get(k)}" for k in keys)


def meaning(env: dict[str, str], fields: dict[str, object]) -> str | None:
    """What the parse must say for the unit to do what it means."""
    tp = fields.get("tp")
    if env.get("NCCL_P2P_DISABLE") == "1" and isinstance(tp, int) and tp > 1 \
            and not fields.get("disable_custom_all_reduce"):
        return "P2P is off but the engine's custom all-reduce stays on"
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    nodes, pp, dp = fields.get("nnodes") or 1, fields.get("pp") or 1, fields.get("dp") or 1
    if visible and isinstance(tp, int) and isinstance(pp, int) and isinstance(nodes, int) \
            and dp == 1 and tp * pp % nodes == 0 and tp * pp // nodes != len(visible):
        # each node runs tp x pp / nnodes ranks, one per visible GPU
        return (f"the engine runs {tp * pp // nodes} GPU rank(s) on this node "
                f"(tp {tp} x pp {pp} / {nodes} node(s)); the unit gives it {len(visible)} GPU(s)")
    return None


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    lines = []
    for r in [header] + rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return "\n".join(lines)


def git_head(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip()[:72] or "not a git tree") + (" (+ uncommitted changes)" if dirty else "")


def built_venvs() -> Path:
    """The pinned venvs' cache, built (niced: a shared machine) when missing."""
    subprocess.run(["nice", "-n", "10", sys.executable, str(BUILD), "parsers"], check=True)
    done = subprocess.run([sys.executable, str(BUILD), "--print-paths"], capture_output=True,
                          text=True, check=True)
    return Path(json.loads(done.stdout)["parsers"])


def setup(venvs: Path, python: str) -> int:
    for engine in ENGINES:
        target = venvs / engine
        pins = TOOLS / "engine-venvs" / f"{engine}.txt"
        print(f"setup: {target} from {pins.relative_to(TOOLS.parent)}", flush=True)
        subprocess.run([python, "-m", "venv", "--clear", str(target)], check=True)
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + [TORCH], check=True)
        subprocess.run(pip + ["--no-deps", "-r", str(pins)], check=True)
    return 0


def check(args: argparse.Namespace) -> int:
    tree = Path(args.tree).resolve()
    try:
        venvs = Path(args.venvs) if args.venvs else built_venvs()
    except subprocess.CalledProcessError as e:
        print(f"check-engine-parsers: building the venvs failed: {e}", file=sys.stderr)
        return 2
    missing = [e for e in ENGINES if not venv_python(venvs, e).exists()]
    if missing:
        print(f"check-engine-parsers: no venv for {', '.join(missing)} under {venvs}: "
              "run tools/check-engine-parsers --setup", file=sys.stderr)
        return 2
    extra = dict(v.split("=", 1) for v in args.var)
    with tempfile.TemporaryDirectory(prefix="engine-parsers-") as tmp:
        work = Path(tmp)
        units: list[Unit] = []
        problems: list[str] = []
        try:
            if not args.no_render:
                rendered, problems = render_cases(tree, work)
                units += rendered
            if not args.no_golden:
                units += golden_units(tree)
        except UnitError as e:
            print(f"check-engine-parsers: {e}", file=sys.stderr)
            return 2
        # one row per (unit, variant); identical render and golden lines share it
        jobs: dict[tuple[str, str, str], list[str]] = {}
        seen: dict[tuple[str, str, tuple[str, str, str]], int] = {}
        others: dict[str, int] = {}
        rows: list[dict[str, object]] = []
        for u in units:
            engine = u.engine
            if engine is None:
                others[u.other_engine()] = others.get(u.other_engine(), 0) + 1
                continue
            assert u.exec is not None
            for label, env in u.variants(extra):
                argv = [u.exec.executable] + u.exec.argv(env)[1:]
                key = (engine, json.dumps(argv), json.dumps(env, sort_keys=True))
                where = f"{u.case}/{u.name}"
                if (where, label, key) in seen:
                    rows[seen[(where, label, key)]]["source"] = "render+golden"
                    continue
                seen[(where, label, key)] = len(rows)
                jobs.setdefault(key, argv)
                rows.append({"source": u.source, "unit": where, "engine": engine,
                             "variant": label, "key": key, "env": env})
        (work / "home").mkdir()
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {k: pool.submit(probe, venvs, k[0], argv, json.loads(k[2]), work / "home")
                       for k, argv in jobs.items()}
            results = {k: f.result() for k, f in futures.items()}
    failed = 0
    versions: dict[str, object] = {}
    out_rows = []
    for r in sorted(rows, key=lambda r: (str(r["engine"]), str(r["unit"]), str(r["source"]))):
        res = results[r["key"]]  # type: ignore[index]
        if "fields" in res:
            versions.update(res.get("versions", {}))  # type: ignore[arg-type]
            wrong = meaning(r["env"], res["fields"])  # type: ignore[arg-type]
            verdict = "WRONG" if wrong else "OK"
            detail = wrong or describe(str(r["engine"]), res["fields"])  # type: ignore[arg-type]
            detail += "".join(f" ({n})" for n in res.get("notes", []))  # type: ignore[union-attr]
        else:
            verdict, detail = "REJECTED", str(res["error"])
        failed += verdict != "OK"
        argv = json.loads(r["key"][1])  # type: ignore[index]
        out_rows.append([verdict, str(r["engine"]), str(r["source"]), str(r["unit"]),
                         str(r["variant"]), detail])
        if args.argv:
            out_rows.append(["", "", "", "", "argv:", " ".join(argv[1:])])
    print(f"# tools/check-engine-parsers {' '.join(sys.argv[1:])}".rstrip())
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; tree {tree}: "
          f"{git_head(tree)}")
    print("# engines: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
          + f"; venvs {venvs}")
    print(table(out_rows, ["RESULT", "ENGINE", "SOURCE", "UNIT", "ENV FILE", "PARSED / ERROR"]))
    for p in problems:
        print(f"# {p}")
    if others:
        print("# not checked (no parser here): "
              + ", ".join(f"{k} x{v}" for k, v in sorted(others.items())))
    print(f"# {len(rows)} argv checked ({len(jobs)} distinct), {failed} not accepted as meant")
    if not rows:
        print("check-engine-parsers: no SGLang or vLLM unit found", file=sys.stderr)
        return 2
    return 1 if failed else (2 if problems else 0)


def main() -> int:
    p = argparse.ArgumentParser(prog="tools/check-engine-parsers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", default=str(TOOLS.parent),
                   help="checkout whose tests/cases and tests/golden are checked (read only)")
    p.add_argument("--venvs", default=os.environ.get("INFER_UNITS_ENGINE_VENVS") or None,
                   help="folder holding sglang/ and vllm/ venvs (default "
                        "$INFER_UNITS_ENGINE_VENVS, else the cache `tools/engines/build "
                        "parsers` fills, built when missing)")
    p.add_argument("--setup", action="store_true",
                   help="build the venvs from tools/engine-venvs/*.txt, then exit: the "
                        "cache (a no-op when there), or with --venvs (re)built in that folder")
    p.add_argument("--python", default="python3",
                   help="interpreter for --setup's venvs in a --venvs folder")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="off value for a $NAME the env file sets (default for "
                        f"{P2P_VAR}: the unit's --p2p-off-args)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--argv", action="store_true", help="print each argv under its row")
    p.add_argument("--no-golden", action="store_true")
    p.add_argument("--no-render", action="store_true")
    args = p.parse_args()
    if any("=" not in v for v in args.var):
        p.error("--var takes NAME=VALUE")
    if args.setup:
        if args.venvs:
            return setup(Path(args.venvs), args.python)
        print(f"setup: {built_venvs()}")
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())

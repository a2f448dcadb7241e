"""One-off (device; run from the repository root: python3 bench/results/2026-12-04-h200-sixth/tools/reap_timeline.py): a timeline of `infer-units reap --gpus 0 --term-grace 0s`
against two TERM-ignoring 20 GiB holders, via sys.monitoring (3.12: a
disabled code location costs nothing after its first call), 6 rounds."""
import json, os, subprocess, sys, time
ROOT = os.getcwd()     # the repository root
sys.path.insert(0, ROOT)
from bench.reap_bench import start_holders
from infer_units.helpers.facts.gpus import backend
import site
DEPS = [d for d in site.getsitepackages() if os.path.isdir(d)]
LAUNCH = r'''
import time; T0 = time.perf_counter()
import sys
sys.path.insert(0, %r); sys.path += %r
sys.argv[0] = "infer-units"
marks = []
NAMES = {"_run", "_warm_nvml", "warm_nvml", "reap", "chosen", "_load_pynvml", "_nvml_init", "_warmed",
         "_attribute", "attribute", "_drop_non_users", "_signal", "_reap_round", "users", "gpus",
         "record_reap", "leave", "_idle", "memory", "wait_exits", "wait"}
M = sys.monitoring; TOOL = 3
M.use_tool_id(TOOL, "timeline")
def start(code, off):
    if code.co_name in NAMES and "infer_units" in code.co_filename:
        marks.append((">" + code.co_name, round((time.perf_counter() - T0) * 1000, 2)))
        return None
    return M.DISABLE
def ret(code, off, val):
    if code.co_name in NAMES and "infer_units" in code.co_filename:
        marks.append(("<" + code.co_name, round((time.perf_counter() - T0) * 1000, 2)))
        return None
    return M.DISABLE
M.register_callback(TOOL, M.events.PY_START, start)
M.register_callback(TOOL, M.events.PY_RETURN, ret)
M.set_events(TOOL, M.events.PY_START | M.events.PY_RETURN)
import posix; real = posix._exit
def _exit(code):
    marks.append(("exit", round((time.perf_counter() - T0) * 1000, 2)))
    import json; sys.stderr.write("TIMELINE " + json.dumps(marks) + "\n"); sys.stderr.flush()
    real(code)
posix._exit = _exit
from infer_units.helpers.entry import main
main()
''' % (ROOT, DEPS)
open("/tmp/tl.py", "w").write(LAUNCH)
b = backend()
out = []
for r in range(6):
    procs = start_holders(b, 2, 20.0, ignore_term=True)
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-IS", "/tmp/tl.py", "reap", "--gpus", "0", "--term-grace", "0s",
                        "--timeout", "60s"], capture_output=True, text=True)
    wall = (time.monotonic() - t) * 1000
    for q in procs:
        q.wait(10)
    line = [l for l in p.stderr.splitlines() if l.startswith("TIMELINE ")]
    marks = json.loads(line[0][9:]) if line else []
    print(f"round {r}: rc {p.returncode} wall {wall:.1f} ms")
    print("  " + " ".join(f"{n}@{t}" for n, t in marks))
    out.append({"wall": wall, "marks": marks, "stderr": p.stderr[-3000:]})
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "timeline.json"), "w"), indent=1)
t = time.monotonic(); subprocess.run([sys.executable, "-IS", "-c", "pass"]); print(f"bare -IS {(time.monotonic()-t)*1000:.1f} ms")

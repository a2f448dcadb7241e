"""`infer-units check` also asks systemd: `systemd-analyze verify` on the
units a model would get, where systemd-analyze is installed.

Its findings are warnings, not errors: the generator already refuses every
model whose unit text systemd would read otherwise, and what verify adds on a
host is mostly "this program is not installed (yet)" (a server binary, a venv
still to be built), which an operator checking a file before installing it
wants to hear, not to be failed for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

ANALYZE = "systemd-analyze"
TIMEOUT_S = 60.0


def available() -> str | None:
    return shutil.which(ANALYZE, path=os.environ.get("PATH", "") + ":/usr/bin:/bin")


def verify_units(units: list[Any]) -> dict[str, list[str]] | None:
    """Unit name -> verify's lines about it; None when systemd-analyze is not
    installed.  `units` are RenderedUnits (a model's unit and its companions)."""
    from ...generator.atomicfile import open_dir
    from ...generator.main import write_unit
    analyze = available()
    if analyze is None or not units:
        return None
    with tempfile.TemporaryDirectory(prefix="infer-units-verify-") as out:
        with open_dir(out) as d:
            for unit in units:
                write_unit(d, unit)
        paths = [os.path.join(out, u.name) for u in units if "/" not in u.name]
        try:
            done = subprocess.run([analyze, "verify", "--man=no", *paths], capture_output=True,
                                  text=True, timeout=TIMEOUT_S, env={**os.environ,
                                                                     "SYSTEMD_LOG_COLOR": "0"})
        except (OSError, subprocess.TimeoutExpired) as e:
            return {units[0].name: [f"systemd-analyze verify did not finish: {e}"]}
    found: dict[str, list[str]] = {}
    for line in dict.fromkeys((done.stdout + done.stderr).splitlines()):   # once each
        line = line.replace(out + "/", "").strip()
        for unit in units:
            if unit.name in line:
                found.setdefault(unit.name, []).append(line)
                break
    return found

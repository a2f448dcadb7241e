"""infer-units-generator normal-dir [early-dir late-dir]

Writes one <name>.service per valid model file into normal-dir, and the
.wants/.requires links its [install] asks for; a bad file is logged and
skipped, the others are still generated.
"""

from __future__ import annotations

import os
import sys

from .build import load_all
from .liveness import write_companions
from .log import GeneratorLog
from .render import RenderedUnit, render


def write_unit(out_dir: str, unit: RenderedUnit) -> None:
    path = os.path.join(out_dir, unit.name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(unit.text)
    for link_dir in unit.links:
        full = os.path.join(out_dir, link_dir)
        if not os.path.isdir(full):
            os.makedirs(full)
        link = os.path.join(full, unit.name)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.join("..", unit.name), link)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    log = GeneratorLog()
    if len(argv) not in (1, 3):
        log.error("usage: infer-units-generator normal-dir [early-dir late-dir]")
        return 1
    out_dir = argv[0]
    loaded = load_all()
    for error in loaded.errors:
        log.error(f"{error} (no unit generated)")
    for conflict in loaded.conflicts:
        log.error(f"{conflict} (both generated; the start hook refuses to take a busy GPU)")
    for model in loaded.models:
        try:
            write_unit(out_dir, render(model))
            write_companions(out_dir, model, write_unit)   # [liveness]: timer, probe, drop-in
            log.debug(f"{model.main_path}: wrote {model.unit_name}")
        except OSError as e:
            log.error(f"{model.main_path}: cannot write {model.unit_name}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

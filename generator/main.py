"""infer-units-generator normal-dir [early-dir late-dir]

Writes one <name>.service per valid model file into normal-dir, and the
.wants/.requires links its [install] asks for; a bad file is logged and
skipped, the others are still generated.
"""

from __future__ import annotations

import os
import sys

from .build import load_all
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
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) not in (1, 3):
        # Only a person gets this wrong (systemd passes three): tell the terminal.
        print("usage: infer-units-generator normal-dir [early-dir late-dir]", file=sys.stderr)
        return 1
    log = GeneratorLog()
    out_dir = argv[0]
    loaded = load_all()
    for error in loaded.errors:
        log.error(f"{error} (no unit generated)")
    for conflict in loaded.conflicts:
        log.error(f"{conflict} (both generated; the start hook refuses to take a busy GPU)")
    for model in loaded.models:
        try:
            write_unit(out_dir, render(model))
            log.debug(f"{model.main_path}: wrote {model.unit_name}")
        except OSError as e:
            log.error(f"{model.main_path}: cannot write {model.unit_name}: {e.strerror}")
    log.finish(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

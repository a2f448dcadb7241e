"""Plain aligned columns for terminal output (holders, status)."""

from __future__ import annotations

from typing import Sequence


def format_table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Pad every column but the last to its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(r[i].ljust(w) for i, w in enumerate(widths)), r[-1]]).rstrip()
            for r in rows]

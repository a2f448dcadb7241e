"""One duration bound: every span the generator accepts, the hooks' argument
parser accepts too (a "400d" [ready] timeout passed check, then every start
failed on its own argv)."""

from __future__ import annotations

import pytest

from infer_units.generator.durations import MAX_SECONDS, parse_duration
from infer_units.helpers.argtypes import duration

SPANS = ["1s", "400d", "366d 1s", "3650d", f"{MAX_SECONDS}s", f"{MAX_SECONDS // 86400}d"] + [
    f"{n}d" for n in range(0, 3651, 97)]


@pytest.mark.parametrize("span", SPANS)
def test_what_the_generator_accepts_the_hooks_accept(span: str) -> None:
    assert duration(span) == parse_duration(span)


def test_one_past_the_bound_is_refused_by_both() -> None:
    span = f"{MAX_SECONDS + 1}s"
    with pytest.raises(ValueError):
        parse_duration(span)
    with pytest.raises(ValueError):
        duration(span)

"""helpers/jsontext.py against the json module it stands in for: for any
JSON value the same text out, for any text the same value in or the same
kind of error, and none of re, enum or json imported on its way (the reason
it exists)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from infer_units.helpers import jsontext

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "infer-units-hypothesis"))

ROOT = Path(__file__).resolve().parents[2]

scalars = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=25)


def _same(a: object, b: object) -> bool:
    """Equal, NaN counting as equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(values)
def test_the_same_text_as_json_dumps_and_back(value: object) -> None:
    text = jsontext.dumps(value)
    assert text == json.dumps(value)
    assert _same(jsontext.loads(text), json.loads(text))
    assert jsontext.dumps(value, indent=2, sort_keys=True) == json.dumps(value, indent=2,
                                                                        sort_keys=True)


# Text near JSON: pieces of it glued together, with whitespace and junk.
pieces = st.sampled_from(['{', '}', '[', ']', ',', ':', '"a"', '"\\u00e9"', '"\\ud800"', '1',
                          '-0', '1e5', '.5', 'NaN', '-Infinity', 'true', 'nul', ' ', '\n',
                          '\t', '\x0b', '"\x01"', '01', '[1,]', '{"a":1,}', 'x'])


# Around valid JSON: what json counts as whitespace and what it does not.
edges = st.lists(st.sampled_from([" ", "\n", "\t", "\r", "\x0b", "\x0c", "\xa0", "\u2028", "x",
                                  ","]), max_size=3).map("".join)
wrapped = st.tuples(edges, values.map(json.dumps), edges).map("".join)


@settings(max_examples=600, deadline=None)
@given(st.lists(pieces, max_size=12).map("".join) | wrapped)
def test_any_text_reads_as_json_loads_reads_it(text: str) -> None:
    try:
        expected = json.loads(text)
    except ValueError as e:
        with pytest.raises(ValueError) as got:
            jsontext.loads(text)
        assert str(got.value) == str(e)
        return
    assert _same(jsontext.loads(text), expected)


def test_an_object_json_cannot_write_is_its_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"a": object()})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsontext.dumps(loop)


def test_reading_and_writing_imports_neither_re_nor_json() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from infer_units.helpers import jsontext as j; "
            "assert j.loads(j.dumps({'a': [1, 2.5, None, 'x']})) == {'a': [1, 2.5, None, 'x']}; "
            "print(sorted(m for m in ('re', 'enum', 'json', 'json.decoder') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text", ['{"stopped": [', '{"a": 1} x', "", "{'a': 1}"])
def test_bad_text_in_a_fresh_process_is_jsons_error(text: str) -> None:
    """Before json.decoder is imported the C scanner cannot raise its error
    (a SystemError instead): a damaged file must still read as a ValueError."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from infer_units.helpers import jsontext as j\n"
            "try:\n    j.loads(sys.argv[2])\nexcept ValueError as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT), text],
                         capture_output=True, text=True, check=True).stdout
    with pytest.raises(ValueError) as expected:
        json.loads(text)
    assert out.strip() == f"JSONDecodeError {expected.value}"

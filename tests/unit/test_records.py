"""helpers/records.py against the stdlib's dataclasses it stands in for: for
any record shape (required fields, defaults, default factories, frozen or
not) and any call (positional and keyword arguments, too many, too few,
unknown or doubled names) the same instance or the same kind of error, the
same equality, hash and frozenness."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest

from infer_units.helpers import records

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "infer-units-hypothesis"))

NAMES = ("a", "b", "c", "d", "e")
# Per field: required, a default value, or a factory (list or dict).  The
# stdlib wants the required fields first, as our records always have them.
REQUIRED = ("required", "field()")
kinds = st.lists(st.sampled_from(["required", "field()", "default", "field(default=)", "list",
                                  "dict"]), min_size=0,
                 max_size=len(NAMES)).map(lambda ks: sorted(ks, key=lambda k: k not in REQUIRED))


def _build(make: Any, field: Any, shape: list[str], frozen: bool) -> type:
    namespace: dict[str, Any] = {"__annotations__": {}}
    for name, kind in zip(NAMES, shape):
        namespace["__annotations__"][name] = "object"
        if kind == "default":
            namespace[name] = (name, 1)        # a tuple: never mistaken for a marker
        elif kind == "field()":
            namespace[name] = field()
        elif kind == "field(default=)":
            namespace[name] = field(default=(name, 2))
        elif kind == "list":
            namespace[name] = field(default_factory=list)
        elif kind == "dict":
            namespace[name] = field(default_factory=dict)
    return make(frozen=frozen)(type("R", (), namespace))


def _outcome(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        made = cls(*args, **kwargs)
    except TypeError:
        return TypeError
    return made


def _hashed(record: Any) -> Any:
    try:
        return hash(record)
    except TypeError:
        return TypeError


values = st.one_of(st.integers(), st.text(max_size=3), st.none())


@settings(max_examples=300, deadline=None)
@given(shape=kinds, frozen=st.booleans(), args=st.lists(values, max_size=6),
       kwargs=st.dictionaries(st.sampled_from(NAMES + ("z",)), values, max_size=4))
def test_records_take_and_refuse_what_dataclasses_do(shape: list[str], frozen: bool,
                                                      args: list[Any],
                                                      kwargs: dict[str, Any]) -> None:
    ours = _build(records.dataclass, records.field, shape, frozen)
    theirs = _build(dataclasses.dataclass, dataclasses.field, shape, frozen)
    mine, real = _outcome(ours, tuple(args), kwargs), _outcome(theirs, tuple(args), kwargs)
    if real is TypeError:
        assert mine is TypeError
        return
    assert mine is not TypeError
    names = NAMES[:len(shape)]
    assert [getattr(mine, n) for n in names] == [getattr(real, n) for n in names]
    # Equal to an instance made alike, a factory's value fresh for each.
    twin = ours(*args, **kwargs)
    assert twin == mine
    for n, kind in zip(names, shape):
        if kind in ("list", "dict") and n not in kwargs and names.index(n) >= len(args):
            assert getattr(twin, n) is not getattr(mine, n)
    if frozen:
        assert _hashed(mine) == _hashed(real)     # the fields' tuple, or unhashable alike
        with pytest.raises(AttributeError):
            setattr(mine, names[0] if names else "a", 0)
        with pytest.raises(AttributeError):
            delattr(mine, names[0] if names else "a")
    else:
        with pytest.raises(TypeError):
            hash(mine)
        if names:
            setattr(mine, names[0], "changed")
            assert getattr(mine, names[0]) == "changed"
    assert repr(mine).startswith("R(")


def test_a_record_class_costs_no_compiled_code() -> None:
    """The reason __init__ is a closure: no exec() of generated source."""
    calls: list[str] = []
    real_exec = exec

    def spy(*a: Any, **k: Any) -> Any:
        calls.append("exec")
        return real_exec(*a, **k)

    import builtins
    builtins.exec = spy
    try:
        _build(records.dataclass, records.field, ["required", "default", "list"], True)
    finally:
        builtins.exec = real_exec
    assert calls == []

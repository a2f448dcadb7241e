"""`dataclass` and `field` for the hooks' path, without the import cost.

The stdlib's dataclasses imports inspect (and with it ast, dis, enum, re):
~15 ms of every hook's start, on every `systemctl restart` (bench/
restart_bench.py).  The records here use only what this project uses:
fields in annotation order, defaults, field(default_factory=...), frozen,
__init__/__repr__/__eq__ (and __hash__ when frozen).  Type checkers see the
stdlib's (TYPE_CHECKING), so the classes are checked as dataclasses.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:
    _MISSING = object()

    class _Field:
        __slots__ = ("default", "default_factory")

        def __init__(self, default, default_factory) -> None:
            self.default = default
            self.default_factory = default_factory

    def field(*, default=_MISSING, default_factory=_MISSING):
        return _Field(default, default_factory)

    def _fields(cls):
        names = []
        for klass in reversed(cls.__mro__):
            for name, kind in klass.__dict__.get("__annotations__", {}).items():
                if "ClassVar" in str(kind):
                    continue
                if name not in names:
                    names.append(name)
        return names

    def _make(cls, frozen: bool):
        names = _fields(cls)
        scope = {"_object_setattr": object.__setattr__, "_MISSING": _MISSING}
        params, body = [], []
        for name in names:
            value = cls.__dict__.get(name, _MISSING)
            if isinstance(value, _Field) and value.default_factory is not _MISSING:
                scope[f"_factory_{name}"] = value.default_factory
                params.append(f"{name}=_MISSING")
                body.append(f"{name} = _factory_{name}() if {name} is _MISSING else {name}")
                delattr(cls, name)
            else:
                if isinstance(value, _Field):
                    value = value.default
                    setattr(cls, name, value)
                if value is _MISSING:
                    params.append(name)
                else:
                    scope[f"_default_{name}"] = value
                    params.append(f"{name}=_default_{name}")
            body.append(f"_object_setattr(self, {name!r}, {name})" if frozen
                        else f"self.{name} = {name}")
        source = (f"def __init__(self, {', '.join(params)}):\n    " +
                  ("\n    ".join(body) or "pass") + "\n")
        exec(source, scope)    # noqa: S102 - our own field names, as dataclasses does
        cls.__init__ = scope["__init__"]
        cls.__init__.__qualname__ = f"{cls.__qualname__}.__init__"

        def __repr__(self) -> str:
            inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
            return f"{type(self).__qualname__}({inner})"

        def __eq__(self, other):
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in names)

        cls.__repr__ = __repr__
        cls.__eq__ = __eq__
        if frozen:
            def __setattr__(self, name, value):
                raise AttributeError(f"cannot assign to field {name!r} of a frozen "
                                     f"{type(self).__name__}")

            def __hash__(self) -> int:
                return hash(tuple(getattr(self, n) for n in names))

            cls.__setattr__ = __setattr__
            cls.__delattr__ = __setattr__
            cls.__hash__ = __hash__
        else:
            cls.__hash__ = None
        return cls

    def dataclass(cls=None, /, *, frozen: bool = False):
        if cls is None:
            return lambda c: _make(c, frozen)
        return _make(cls, frozen)

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
        names = tuple(_fields(cls))
        count = len(names)
        known = frozenset(names)
        defaults, factories = {}, {}
        for name in names:
            value = cls.__dict__.get(name, _MISSING)
            if isinstance(value, _Field) and value.default_factory is not _MISSING:
                factories[name] = value.default_factory
                delattr(cls, name)
            elif isinstance(value, _Field):
                if value.default is _MISSING:
                    delattr(cls, name)         # field(): required, as a bare annotation
                else:
                    setattr(cls, name, value.default)
                    defaults[name] = value.default
            elif value is not _MISSING:
                defaults[name] = value
        qualname = cls.__qualname__
        setter = object.__setattr__ if frozen else setattr     # a frozen class refuses setattr

        # One __init__ for every record, no code compiled per class: the
        # stdlib's exec() of a generated __init__ (and ours, before) cost
        # 100-300 us a class, 2-3 ms of pre-start's imports (15 records).
        def __init__(self, *args, **kwargs):
            if len(args) > count:
                raise TypeError(f"{qualname}.__init__() takes {count + 1} positional "
                                f"arguments but {len(args) + 1} were given")
            values = dict(zip(names, args))
            for key, value in kwargs.items():
                if key not in known:
                    raise TypeError(f"{qualname}.__init__() got an unexpected keyword "
                                    f"argument {key!r}")
                if key in values:
                    raise TypeError(f"{qualname}.__init__() got multiple values for "
                                    f"argument {key!r}")
                values[key] = value
            for name in names:
                if name in values:
                    value = values[name]
                elif name in defaults:
                    value = defaults[name]
                elif name in factories:
                    value = factories[name]()
                else:
                    raise TypeError(f"{qualname}.__init__() missing 1 required positional "
                                    f"argument: {name!r}")
                setter(self, name, value)

        __init__.__qualname__ = f"{qualname}.__init__"
        cls.__init__ = __init__

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

            def __delattr__(self, name):
                raise AttributeError(f"cannot delete field {name!r} of a frozen "
                                     f"{type(self).__name__}")

            def __hash__(self) -> int:
                return hash(tuple(getattr(self, n) for n in names))

            cls.__setattr__ = __setattr__
            cls.__delattr__ = __delattr__
            cls.__hash__ = __hash__
        else:
            cls.__hash__ = None
        return cls

    def dataclass(cls=None, /, *, frozen: bool = False):
        if cls is None:
            return lambda c: _make(c, frozen)
        return _make(cls, frozen)

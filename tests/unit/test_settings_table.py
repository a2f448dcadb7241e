"""generator/settings.py SETTINGS is the one declaration of every model-file
key: it drives parsing, the defaults, the docs, and the Model's attributes
(generator/model.py copies no setting by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_units.generator.loader import MergedConfig
from infer_units.generator.model import Model, build_model
from infer_units.generator.settings import DERIVED, SETTINGS, Setting, reference_markdown


def merged(data: dict) -> MergedConfig:
    m = MergedConfig("m", "/etc/infer-units/m.toml")
    m.data = data
    m.sources = [m.main_path]
    return m


def test_every_direct_setting_is_a_declared_model_attribute() -> None:
    declared = set(Model.__annotations__)
    direct = [s for s in SETTINGS if s.attr != DERIVED]
    assert len(direct) >= 20
    for s in direct:
        assert s.attr in declared, f"{s.key}: Model declares no attribute {s.attr!r}"
    assert len({s.attr for s in direct}) == len(direct), "two settings fill one attribute"


def test_the_model_holds_what_the_table_says() -> None:
    """Each direct setting's value reaches its attribute (converted), and an
    unset one its default, straight from the table."""
    m = build_model(merged({"engine": "vllm", "model": "/models/x", "gpus": [0, 1],
                            "port": 8000, "args": ["--a", "b"], "health": {"accept": ["xid"]},
                            "reap": {"term-grace": "3s"}, "service": {"Nice": 5}}))
    assert m.args == ("--a", "b") and m.health_accept == ("xid",)
    assert m.reap_term_grace == 3.0 and m.service_directives == {"Nice": ["5"]}
    for s in SETTINGS:
        if s.attr == DERIVED or s.key in ("engine", "model", "gpus", "port", "args",
                                          "health.accept", "reap.term-grace", "service"):
            continue
        expected = s.default if s.convert is None else s.convert(s.default)
        assert getattr(m, s.attr) == expected, s.key


def test_a_setting_without_a_declared_attribute_fails_at_once(monkeypatch) -> None:
    """The table and Model's annotations cannot drift apart silently."""
    from infer_units.generator import model as model_module
    extra = Setting("ready.extra", lambda v: v, 1, "not a key", attr="ready_extra")
    monkeypatch.setattr(model_module, "_DIRECT",
                        model_module._DIRECT + ((extra.key, extra.attr, None),))
    monkeypatch.setitem(model_module.BY_KEY, extra.key, extra)
    monkeypatch.setitem(model_module._DEFAULTS, extra.key, extra.default)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ready_extra'"):
        build_model(merged({"engine": "command", "command": ["/bin/true"]}))


def test_the_docs_table_is_the_generated_one_with_integers_as_written() -> None:
    table = reference_markdown()
    assert "| `liveness.failures` | 4 |" in table
    assert '| `canary.on-mismatch` | "refuse" |' in table
    docs = Path(__file__).parents[2] / "docs" / "model-files.md"
    assert table in docs.read_text()

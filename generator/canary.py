"""[canary]: the known-answer check's settings as a Canary.

After the server answers health and before the unit is active, one greedy
request (helpers/act/canary.py) is compared with the answer recorded for
this model on this host.  This module turns the model file's `[canary]`
table into a Canary (None: off) and names where the records live; the
check itself, its record and its key are the helpers'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engines import EngineSpec
from .errors import ConfigError
from .loader import MergedConfig
from .settings import CANARY_APIS as APIS
# Root's, 0700: the recorded answers and what they were recorded under.
RECORD_DIR = "/var/lib/infer-units/canary"
MAX_TOKENS = 256          # a few tokens tell; more only lengthens every start


@dataclass(frozen=True)
class Canary:
    api: str
    on_mismatch: str        # "refuse" | "warn"
    prompt: str
    tokens: int
    timeout: float


def build_canary(values: dict[str, Any], merged: MergedConfig,
                 spec: EngineSpec) -> Canary | None:
    """None when off: `enabled = false`, or no API is known for the engine
    (engine = "command" without `api`)."""
    def fail(key: str, reason: str) -> None:
        raise ConfigError(merged.file_of(key), key, reason)

    api = values["canary.api"] or spec.canary_api
    enabled = values["canary.enabled"]
    if enabled is None:
        enabled = api is not None
    if not enabled:
        return None
    if api is None:
        fail("canary.enabled", 'no request is known for engine = "command": set [canary] api '
             '(' + ", ".join(APIS) + ")")
    if not 1 <= values["canary.tokens"] <= MAX_TOKENS:
        fail("canary.tokens", f"must be 1 to {MAX_TOKENS}, got {values['canary.tokens']}")
    if values["canary.timeout"] <= 0:
        fail("canary.timeout", "must be longer than 0s")
    assert api is not None
    return Canary(api, values["canary.on-mismatch"], values["canary.prompt"],
                  values["canary.tokens"], values["canary.timeout"])

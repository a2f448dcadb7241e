"""One model across several hosts ([nodes]), on the engine's own distributed
runtime: which rank this host is, and what that changes in the unit.

Every host gets the same model file; `rank` usually comes from a host-local
drop-in, else from this host's name's position in `hosts`.  The head (rank 0)
serves the model; a worker (rank > 0) waits for the head's rendezvous before
it starts, counts as ready once the head answers health (the engines answer
only when every rank joined), and is probed on the head's health afterwards
(liveness), so that a head that restarted (no engine lets a rank rejoin a
running group) takes its workers through a restart too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .urls import bracketed, check_host, parse_host_port

if TYPE_CHECKING:      # an annotation only: the hooks import this module, not the loader
    from .loader import MergedConfig

# Engines with a multi-node runtime of their own; TensorRT-LLM needs an MPI
# launcher, TGI and llama.cpp have none.
MULTI_NODE_ENGINES = ("sglang", "vllm")
DEFAULT_RENDEZVOUS_PORT = 29500
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Nodes:
    hosts: tuple[str, ...]      # every host, in rank order
    rank: int                   # this host's
    addr_host: str              # rendezvous (SGLang --dist-init-addr, vLLM --master-addr)
    addr_port: int
    head_url: str               # the head's health: the group's

    @property
    def count(self) -> int:
        return len(self.hosts)

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def addr(self) -> str:
        return f"{bracketed(self.addr_host)}:{self.addr_port}"


def this_host() -> str:
    """The host name [nodes] hosts are matched against (INFER_UNITS_HOSTNAME for tests)."""
    return os.environ.get("INFER_UNITS_HOSTNAME") or os.uname().nodename


def _split_addr(text: str) -> tuple[str, int]:
    """host:port or [v6]:port, read as the hooks read it (urls.py)."""
    return parse_host_port(text)


def build_nodes(v: dict[str, Any], merged: MergedConfig, health_path: str) -> Nodes | None:
    """The validated [nodes] of a model, or None for a one-host model."""
    hosts, addr, rank, head_url = (v["nodes.hosts"], v["nodes.addr"], v["nodes.rank"],
                                   v["nodes.head-url"])
    if hosts is None:
        for key, value in (("nodes.addr", addr), ("nodes.rank", rank),
                           ("nodes.head-url", head_url)):
            if value is not None:
                raise ConfigError(merged.file_of(key), key, "needs [nodes] hosts")
        return None

    def fail(key: str, reason: str) -> None:
        raise ConfigError(merged.file_of(key), key, reason)

    engine = v["engine"]
    if engine not in MULTI_NODE_ENGINES:
        fail("nodes.hosts", f"[nodes]: {engine} has no multi-node runtime infer-units can "
             f"drive (one model across hosts works with: {', '.join(MULTI_NODE_ENGINES)})")
    if len(hosts) < 2:
        fail("nodes.hosts", "[nodes] hosts names every host of the model, at least two")
    if len(set(hosts)) != len(hosts):
        fail("nodes.hosts", "a host is listed twice")
    if rank is None:
        rank = _rank_by_name(hosts)
        if rank is None:
            fail("nodes.rank", f"this host ({this_host()!r}) is neither in [nodes] hosts nor "
                 "given a [nodes] rank (set rank in a host-local drop-in)")
    elif rank >= len(hosts):
        fail("nodes.rank", f"rank {rank} is out of range for {len(hosts)} hosts (0..{len(hosts) - 1})")
    try:
        addr_host, addr_port = (_split_addr(addr) if addr is not None
                                else (hosts[0], DEFAULT_RENDEZVOUS_PORT))
    except ValueError as e:
        fail("nodes.addr", str(e))
    if head_url is None:
        if v["host"] in _LOOPBACK:
            fail("host", f"[nodes]: the head must answer health to the other hosts, but it "
                 f"binds {v['host']}; set host (e.g. \"0.0.0.0\") or [nodes] head-url")
        head_url = f"http://{bracketed(addr_host)}:{v['port']}{health_path}"
    assert rank is not None
    return Nodes(tuple(hosts), rank, addr_host, addr_port, head_url)


def _rank_by_name(hosts: list[str]) -> int | None:
    """This host's position in hosts, by full name, else by short name."""
    me = this_host()
    for candidates in ((me,), (me.split(".", 1)[0],)):
        for i, host in enumerate(hosts):
            if host in candidates or host.split(".", 1)[0] in candidates:
                return i
    return None


def check_rank(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"rank {value} is negative")
    return value


def check_hosts(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ValueError("expected an array of host names")
    for host in value:
        check_host(host)
    return list(value)


def check_addr(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected \"host:port\", got {type(value).__name__}")
    _split_addr(value)
    return value

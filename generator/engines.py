"""What differs between inference servers, as data: their argv (render.py
builds it from these fields) and what the code decides on.

Each number here was read in the engine's sources (docs/engines.md says
which version); the comments say where it comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    # The server's argv: `<python> -m <module> <subcommand...>` or
    # `<executable>`, then the model (after model_flag, or a word of its own),
    # tp_flag and its size, host_flag and the host, --port and the port.
    module: str | None                  # python engines: `<python> -m <module>`
    default_executable: str | None      # binary engines (systemd's search path)
    tp_flag: str | None                 # the server's tensor-parallel size flag, if it has one
    health_path: str | None             # default readiness endpoint
    probe_timeout: float                # one health request may take this long
    # [stop] drain default: how long requests in flight may finish after
    # SIGTERM (0 where the server cannot drain); docs/engines.md, "Stopping".
    drain: float
    subcommand: tuple[str, ...] = ()     # after the module (vLLM's `serve`)
    model_flag: str | None = None       # None: the model is a word of its own
    # The flag for a model that is no local file (a hub id), where it differs.
    hub_flag: str | None = None
    host_flag: str = "--host"
    # The server's flag for its drain time (whole seconds), rendered from
    # [stop] drain unless the user's args set it or the server's own default
    # (own_drain) is that drain already.
    drain_flag: str | None = None
    own_drain: float = 0.0
    drain_rounds: int = 1               # TGI waits it out for the router, then the shards
    # Environment that turns the drain off (drain = "0s") where no flag does.
    no_drain_env: tuple[tuple[str, str], ...] = ()
    # Whether SIGTERM lets requests in flight finish at all; a drain asked
    # of a server that cannot is refused, not silently ignored.
    can_drain: bool = True
    # What a stop sends the server (KillSignal=).
    stop_signal: str = "SIGTERM"
    # Every flag can also come from the environment variable of its name
    # (clap's `env`: --master-port <- MASTER_PORT); an explicit flag wins.
    flags_from_env: bool = False
    # argv and environment that turn off every peer-to-peer path that
    # NCCL_P2P_DISABLE=1 does not reach
    p2p_off_args: tuple[str, ...] = ()
    p2p_off_env: tuple[tuple[str, str], ...] = ()
    # Environment for a start whose GPUs the P2P self-test has just found
    # working: the engine's own, slower check of the same is skipped.
    p2p_ok_env: tuple[tuple[str, str], ...] = ()
    # Ports and paths the engine fixes by default, so two instances on one
    # host collide: (flag, offset from the model's port) and (flag, pattern
    # with {name}); rendered unless the user's args set the flag.
    port_flags: tuple[tuple[str, int], ...] = ()
    path_flags: tuple[tuple[str, str], ...] = ()
    # [liveness] probe default: "generate" where /health does not touch the
    # model (a one-token POST /v1/completions does); the flag that renames
    # the model the API serves (the completion's "model" field).
    liveness_probe: str = "health"
    model_name_flag: str | None = None
    # The known-answer check ([canary]): the API its one greedy request goes
    # through ("openai": /v1/completions, "llamacpp": /completion, "tgi":
    # /generate; None: none known, off by default), and where the server
    # says its own version (path, the keys of the JSON object read).
    canary_api: str | None = None
    version_path: str | None = None
    version_keys: tuple[str, ...] = ()

    @property
    def uses_executable(self) -> bool:
        return self.default_executable is not None


# Custom all-reduce kernels of SGLang and vLLM use CUDA IPC peer access
# directly: NCCL_P2P_DISABLE=1 does not reach them.
_NO_CUSTOM_ALL_REDUCE = ("--disable-custom-all-reduce",)
# Time an engine needs after its drain to stop its workers and free the GPUs
# (SGLang waits up to 15 s for its schedulers; vLLM tears down EngineCore):
# [stop] timeout defaults to the drain (times its rounds) plus this.
TEARDOWN_S = 30.0

ENGINE_SPECS: dict[str, EngineSpec] = {
    # python -m sglang.launch_server --model-path M --tp-size N --host H --port P.
    # /health sleeps 1 s and generates one token before answering (503 while
    # warming up or shutting down): a probe needs far more than a second.
    # /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for its token under
    # load.  SIGTERM: /health answers 503 and the server waits, looking every
    # 5 s, until no request is left, with no time limit (so TimeoutStopSec is
    # the drain's bound); new requests are still taken meanwhile.  Then it asks
    # its schedulers to exit and kills its process tree.  SGL_FORCE_SHUTDOWN=1
    # skips the wait (tokenizer_manager.py sigterm_watchdog).
    "sglang": EngineSpec("sglang.launch_server", None, "--tp-size", "/health", probe_timeout=30.0,
                         model_flag="--model-path",
                         drain=30.0, no_drain_env=(("SGL_FORCE_SHUTDOWN", "1"),),
                         p2p_off_args=_NO_CUSTOM_ALL_REDUCE,
                         # FlashInfer's PCIe IPC all-reduce is not gated by the flag
                         p2p_off_env=(("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "0"),),
                         canary_api="openai", version_path="/get_server_info",
                         version_keys=("version",)),
    # python -m vllm.entrypoints.cli.main serve M --tensor-parallel-size N: the
    # `vllm serve` entry (the openai.api_server module is deprecated and has
    # no --headless).  /health is cheap: 200 once the engine is up.
    # SIGTERM: EngineCore finishes the requests it has for up to
    # --shutdown-timeout seconds (default 0: abort them) and answers every new
    # one with an abort at once, then it and its workers are SIGKILLed
    # (launcher.py handle_shutdown, v1/engine/core.py _handle_shutdown).  Its
    # FlashInfer and symmetric memory all-reduce (on by default on Hopper)
    # ignore the custom AR flag.
    "vllm": EngineSpec("vllm.entrypoints.cli.main", None, "--tensor-parallel-size", "/health",
                       probe_timeout=10.0, subcommand=("serve",),
                       drain=30.0, drain_flag="--shutdown-timeout",
                       # /health reads a flag: 200 while the engine was broken (vllm#36960)
                       liveness_probe="generate", model_name_flag="--served-model-name",
                       p2p_off_args=_NO_CUSTOM_ALL_REDUCE,
                       p2p_off_env=(("VLLM_ALLREDUCE_USE_FLASHINFER", "0"),
                                    ("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")),
                       # Its copy test between every GPU pair in subprocesses
                       # (all_reduce_utils.py gpu_p2p_access_check, asked by
                       # custom_all_reduce.py), up to a minute at TP 8; the
                       # vLLM run here skips it by default, older ones ran it.
                       p2p_ok_env=(("VLLM_SKIP_P2P_CHECK", "1"),),
                       canary_api="openai", version_path="/version", version_keys=("version",)),
    # python -m tensorrt_llm.commands.serve M --tp_size N (the trtllm-serve entry
    # point).  SIGTERM is uvicorn's: it closes the port (new connections are
    # refused) and waits for the requests in flight with no time limit
    # (serve/openai_server.py): TimeoutStopSec is the drain's bound.
    "trtllm": EngineSpec("tensorrt_llm.commands.serve", None, "--tp_size", "/health",
                         probe_timeout=10.0, drain=30.0, canary_api="openai",
                         version_path="/version", version_keys=("version",)),
    # text-generation-launcher: launcher -> shards -> router; the router (and
    # with it /health) appears only once every shard is ready and warmed up.
    # SIGTERM: the router stops taking connections and finishes those it has,
    # for up to --graceful-termination-timeout (90 s), then the shards get as
    # long.  Fixed defaults that collide between two TGI
    # models: --master-port 29500 (torch, with several shards),
    # --prometheus-port 9000 (the router dies at start when it is taken),
    # --shard-uds-path /tmp/text-generation-server (a second launcher deletes
    # the first one's sockets).
    "tgi": EngineSpec(None, "text-generation-launcher", "--num-shard", "/health",
                      probe_timeout=10.0, model_flag="--model-id", host_flag="--hostname",
                      drain=90.0, drain_flag="--graceful-termination-timeout", own_drain=90.0,
                      drain_rounds=2, flags_from_env=True,
                      port_flags=(("--master-port", 1), ("--prometheus-port", 2)),
                      path_flags=(("--shard-uds-path", "/tmp/text-generation-server-{name}"),),
                      canary_api="tgi", version_path="/info", version_keys=("version", "sha")),
    # llama-server splits layers over every visible GPU; it has no TP size flag.
    # /health answers 503 "Loading model" until the model is loaded.
    # /health reports the server's state, not a generation: probe liveness
    # with one token (/v1/completions; it ignores the "model" field).
    # SIGTERM ends its task loop at once and cuts the requests in flight
    # (tools/server/server.cpp shutdown_handler): it cannot drain.  With a
    # request streaming it then never exits (its HTTP worker waits for the
    # next token of a loop that is gone), and the stop would end failed in
    # TimeoutStopSec's SIGKILL: the unit stops it with SIGKILL at once; the
    # driver frees its GPU memory as at any exit (wait-free waits for it).
    "llamacpp": EngineSpec(None, "llama-server", None, "/health", probe_timeout=10.0,
                           model_flag="--model", hub_flag="--hf-repo",
                           drain=0.0, can_drain=False, stop_signal="SIGKILL",
                           liveness_probe="generate", model_name_flag="--alias",
                           # /props: build_info names the build (b<N>-<commit>)
                           canary_api="llamacpp", version_path="/props",
                           version_keys=("build_info",)),
    # Any server: [stop] drain is only how long systemd waits after SIGTERM.
    "command": EngineSpec(None, None, None, "/health", probe_timeout=10.0, drain=0.0),
}


def env_name(flag: str) -> str:
    """clap's environment variable for a long flag: --master-port -> MASTER_PORT."""
    return flag.lstrip("-").upper().replace("-", "_")


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value the user's args give `flag` (`--flag V` or `--flag=V`), if any."""
    found = None
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            found = args[i + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1:]
    return found


# SGLang's ports with attention data parallelism (server_args.py PortArgs.init_new,
# data_parallel_controller.py): the dist-init port is the HTTP port + 233 on
# one node (dist-init-addr's port across nodes), its ZMQ ports follow it, and
# across nodes the head hands out worker ports on dist-init's port + 13.
SGLANG_ZMQ_DELTA = 233
SGLANG_HANDSHAKE_DELTA = 13


def _int_flag(args: Sequence[str], *flags: str) -> int | None:
    for flag in flags:
        value = flag_value(args, flag)
        if value is not None and value.isascii() and value.isdigit():
            return int(value)
    return None


def derived_ports(engine: str, port: int | None, args: Sequence[str],
                  head_port: int | None, nnodes: int) -> dict[str, int]:
    """TCP ports the server binds besides its HTTP port, the flags rendered
    for it (TGI's) and a multi-node head's rendezvous port, each derived from
    the model's settings by the engine's own rule (docs/engines.md, "Ports"):
    pre-start checks them as it checks the HTTP port.  `head_port`: the
    rendezvous port when this host is a multi-node head, else None."""
    found: dict[str, int] = {}
    if engine != "sglang":
        return found      # vLLM picks its internal ports free at run time
    nccl = _int_flag(args, "--nccl-port")
    if nccl is not None:
        found["--nccl-port"] = nccl
    attn_dp = _int_flag(args, "--attn-dp-size", "--attention-data-parallel-size")
    if attn_dp is None and "--enable-dp-attention" in args:
        attn_dp = _int_flag(args, "--dp-size", "--data-parallel-size")
    if attn_dp is None or attn_dp <= 1:
        return found
    if nnodes > 1:
        if head_port is None:
            return found      # a worker binds none of them: it connects to the head's
        dist = head_port
    elif port is None:
        return found
    else:
        dist = port + SGLANG_ZMQ_DELTA if port + SGLANG_ZMQ_DELTA <= 65535 \
            else port - SGLANG_ZMQ_DELTA
        found["SGLang dist-init port"] = dist
    base = dist + 1 if dist + 6 <= 65535 else dist - 7
    names = ["tokenizer", "detokenizer", "rpc", "metrics", "scheduler input"]
    if nnodes > 1:
        names.append("load collector")
        found["SGLang DP handshake port"] = dist + SGLANG_HANDSHAKE_DELTA
    for offset, what in enumerate(names):
        found[f"SGLang {what} port"] = base + offset
    return found

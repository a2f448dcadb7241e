"""What differs between inference servers, as data.  Their argv lives in the
templates units/engines/<engine>.j2; this table holds what the code decides on.

Each number here was read in the engine's sources (docs/engines.md says
which version); the comments say where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    module: str | None                  # python engines: `<python> -m <module>`
    default_executable: str | None      # binary engines (systemd's search path)
    tp_flag: bool                       # the server takes a tensor-parallel size
    health_path: str | None             # default readiness endpoint
    probe_timeout: float                # one health request may take this long
    stop_timeout: float                 # the server's own drain window
    # The server's flag for its drain time (seconds): when the user's args
    # set it, [stop] timeout defaults to it plus the engine's teardown.
    drain_flag: str | None = None
    drain_rounds: int = 1               # TGI waits it out for the router, then the shards
    # Every flag can also come from the environment variable of its name
    # (clap's `env`: --master-port <- MASTER_PORT); an explicit flag wins.
    flags_from_env: bool = False
    # argv and environment that turn off every peer-to-peer path that
    # NCCL_P2P_DISABLE=1 does not reach
    p2p_off_args: tuple[str, ...] = ()
    p2p_off_env: tuple[tuple[str, str], ...] = ()
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

    @property
    def uses_executable(self) -> bool:
        return self.default_executable is not None


# Custom all-reduce kernels of SGLang and vLLM use CUDA IPC peer access
# directly: NCCL_P2P_DISABLE=1 does not reach them.
_NO_CUSTOM_ALL_REDUCE = ("--disable-custom-all-reduce",)
# Time an engine needs after its drain to stop its workers and free the GPUs
# (SGLang waits up to 15 s for its schedulers; vLLM tears down EngineCore).
TEARDOWN_S = 30.0

ENGINE_SPECS: dict[str, EngineSpec] = {
    # python -m sglang.launch_server --model-path M --tp-size N --host H --port P.
    # /health sleeps 1 s and generates one token before answering (503 while
    # warming up or shutting down): a probe needs far more than a second.
    # SIGTERM drains in-flight requests, then kills its process tree.
    # /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for its token under
    # load.  Its drain has no time limit (SGL_FORCE_SHUTDOWN=1 skips it).
    "sglang": EngineSpec("sglang.launch_server", None, True, "/health", probe_timeout=30.0,
                         stop_timeout=60.0, p2p_off_args=_NO_CUSTOM_ALL_REDUCE,
                         # FlashInfer's PCIe IPC all-reduce is not gated by the flag
                         p2p_off_env=(("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "0"),)),
    # python -m vllm.entrypoints.cli.main serve M --tensor-parallel-size N: the
    # `vllm serve` entry (the openai.api_server module is deprecated and has
    # no --headless).  /health is cheap: 200 once the engine is up.
    # SIGTERM: --shutdown-timeout (default 0: abort in-flight requests), then
    # EngineCore and its workers are SIGKILLed.  Its FlashInfer and symmetric
    # memory all-reduce (on by default on Hopper) ignore the custom AR flag.
    "vllm": EngineSpec("vllm.entrypoints.cli.main", None, True, "/health", probe_timeout=10.0,
                       stop_timeout=TEARDOWN_S, drain_flag="--shutdown-timeout",
                       # /health reads a flag: 200 while the engine was broken (vllm#36960)
                       liveness_probe="generate", model_name_flag="--served-model-name",
                       p2p_off_args=_NO_CUSTOM_ALL_REDUCE,
                       p2p_off_env=(("VLLM_ALLREDUCE_USE_FLASHINFER", "0"),
                                    ("VLLM_ALLREDUCE_USE_SYMM_MEM", "0"))),
    # python -m tensorrt_llm.commands.serve M --tp_size N (the trtllm-serve entry point)
    "trtllm": EngineSpec("tensorrt_llm.commands.serve", None, True, "/health",
                         probe_timeout=10.0, stop_timeout=30.0),
    # text-generation-launcher: launcher -> shards -> router; the router (and
    # with it /health) appears only once every shard is ready and warmed up.
    # SIGTERM: --graceful-termination-timeout (90 s) for the router, then the
    # same again for the shards.  Fixed defaults that collide between two TGI
    # models: --master-port 29500 (torch, with several shards),
    # --prometheus-port 9000 (the router dies at start when it is taken),
    # --shard-uds-path /tmp/text-generation-server (a second launcher deletes
    # the first one's sockets).
    "tgi": EngineSpec(None, "text-generation-launcher", True, "/health", probe_timeout=10.0,
                      stop_timeout=180.0, drain_flag="--graceful-termination-timeout",
                      drain_rounds=2, flags_from_env=True,
                      port_flags=(("--master-port", 1), ("--prometheus-port", 2)),
                      path_flags=(("--shard-uds-path", "/tmp/text-generation-server-{name}"),)),
    # llama-server splits layers over every visible GPU; it has no TP size flag.
    # /health answers 503 "Loading model" until the model is loaded.
    # /health reports the server's state, not a generation: probe liveness
    # with one token (/v1/completions; it ignores the "model" field).
    "llamacpp": EngineSpec(None, "llama-server", False, "/health", probe_timeout=10.0,
                           stop_timeout=30.0, liveness_probe="generate",
                           model_name_flag="--alias"),
    "command": EngineSpec(None, None, False, "/health", probe_timeout=10.0, stop_timeout=30.0),
}


def env_name(flag: str) -> str:
    """clap's environment variable for a long flag: --master-port -> MASTER_PORT."""
    return flag.lstrip("-").upper().replace("-", "_")


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value the user's args give `flag` (`--flag V` or `--flag=V`), if any."""
    found = None
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            found = args[i + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1:]
    return found

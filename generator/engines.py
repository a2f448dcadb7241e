"""What differs between inference servers, as data.  Their argv lives in the
templates units/engines/<engine>.j2; this table holds what the code decides on."""

from __future__ import annotations


class EngineSpec:
    __slots__ = ("module", "default_executable", "tp_flag", "health_path")

    def __init__(self, module: str | None, default_executable: str | None, tp_flag: bool,
                 health_path: str | None) -> None:
        self.module = module                      # python engines: `<python> -m <module>`
        self.default_executable = default_executable  # binary engines (systemd's search path)
        self.tp_flag = tp_flag                    # the server takes a tensor-parallel size
        self.health_path = health_path            # default readiness endpoint

    @property
    def uses_executable(self) -> bool:
        return self.default_executable is not None


ENGINE_SPECS: dict[str, EngineSpec] = {
    # python -m sglang.launch_server --model-path M --tp-size N --host H --port P
    "sglang": EngineSpec("sglang.launch_server", None, True, "/health"),
    # python -m vllm.entrypoints.openai.api_server --model M --tensor-parallel-size N
    "vllm": EngineSpec("vllm.entrypoints.openai.api_server", None, True, "/health"),
    # python -m tensorrt_llm.commands.serve M --tp_size N (the trtllm-serve entry point)
    "trtllm": EngineSpec("tensorrt_llm.commands.serve", None, True, "/health"),
    # text-generation-launcher --model-id M --num-shard N --hostname H --port P
    "tgi": EngineSpec(None, "text-generation-launcher", True, "/health"),
    # llama-server splits layers over every visible GPU; it has no TP size flag
    "llamacpp": EngineSpec(None, "llama-server", False, "/health"),
    "command": EngineSpec(None, None, False, "/health"),
}

"""What differs between inference servers, as data.  Their argv lives in the
templates units/engines/<engine>.j2; this table holds what the code decides on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    module: str | None             # python engines start as `<python> -m <module>`
    default_executable: str | None # binary engines (resolved by systemd's search path)
    tp_flag: bool                  # whether the server takes a tensor-parallel size
    health_path: str | None        # default readiness endpoint

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

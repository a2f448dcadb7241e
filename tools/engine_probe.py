"""Runs INSIDE an engine's venv (sglang or vllm), never on the generator path:
starts the engine's real entry with one argv, lets it parse and build its
configuration, and stops it right after, before any GPU or model work.

    <venv>/bin/python tools/engine_probe.py '<json: the unit's ExecStart argv>'

The entry itself runs (runpy for `-m module`, the console script's function
for `sglang`/`vllm`), so what is tested is the entry the unit names, with its
own parser.  The one hook replaces the function each entry calls once parsing
is done (sglang: prepare_server_args, vllm: validate_parsed_serve_args): the
hook calls the real one, then prints the parsed key fields and exits 0.

Output: one line `MARK {json}` with "fields" (parsed) or "error"; argparse's
own rejection goes to stderr with exit status 2 as usual.  Needs no project
code: the venv's Python may differ from the one running the project.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from importlib import metadata
from typing import Any, Callable, NoReturn

MARK = "@@infer-units-probe@@"


def _emit(payload: dict[str, Any], status: int) -> NoReturn:
    sys.stdout.write(MARK + " " + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: no atexit handlers, no engine cleanup (sglang's entry wraps its
    # server in try/finally kill_process_tree): nothing was started yet.
    os._exit(status)


def _versions() -> dict[str, str]:
    out = {}
    for name in ("sglang", "vllm", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _hook_sglang() -> None:
    import sglang.srt.server_args as sa

    real = sa.prepare_server_args

    def prepare_server_args(argv: list[str]) -> Any:
        # argparse + ServerArgs.from_cli_args (construction).  Its validation
        # (resolve_once) reads the checkpoint's config and the hardware: it
        # needs the model on disk, so the probe stops here.
        args = real(argv)
        _emit({"fields": {
            "model": args.model_path, "tp": args.tp_size, "host": args.host,
            "port": args.port, "disable_custom_all_reduce": args.disable_custom_all_reduce,
            "nnodes": args.nnodes, "node_rank": args.node_rank,
            "dist_init_addr": args.dist_init_addr, "pp": args.pp_size, "dp": args.dp_size},
            "versions": _versions()}, 0)

    sa.prepare_server_args = prepare_server_args


def _hook_vllm() -> None:
    import vllm.entrypoints.cli.serve as serve
    import vllm.entrypoints.common.cli_args as cli_args

    real = cli_args.validate_parsed_serve_args

    def validate_parsed_serve_args(args: Any) -> None:
        real(args)
        # What ServeSubcommand.cmd does first: the positional model wins.
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        # Every parsed flag must map onto the engine's arguments dataclass
        # (the next thing both entries do); create_engine_config would read
        # the model's config from disk or the hub, so the probe stops here.
        import huggingface_hub.constants as hub
        from vllm.engine.arg_utils import AsyncEngineArgs

        notes = []
        model = str(args.model)
        if hub.HF_HUB_OFFLINE and model.startswith("/") and not os.path.exists(model):
            # Offline, vLLM resolves the model through the hub cache unless the
            # path exists; the unit's model directory is on its host, not here.
            hub.HF_HUB_OFFLINE = False
            notes.append(f"HF_HUB_OFFLINE lookup skipped: {model} is not on this machine")
        engine = AsyncEngineArgs.from_cli_args(args)
        _emit({"notes": notes, "fields": {
            "model": engine.model, "tp": engine.tensor_parallel_size, "host": args.host,
            "port": args.port, "disable_custom_all_reduce": engine.disable_custom_all_reduce,
            "headless": args.headless, "nnodes": engine.nnodes, "node_rank": engine.node_rank,
            "master_addr": engine.master_addr, "master_port": engine.master_port,
            "shutdown_timeout": args.shutdown_timeout, "pp": engine.pipeline_parallel_size,
            "dp": engine.data_parallel_size}, "versions": _versions()}, 0)

    # The serve subcommand imported the name at its own import time.
    cli_args.validate_parsed_serve_args = validate_parsed_serve_args
    serve.validate_parsed_serve_args = validate_parsed_serve_args


HOOKS: dict[str, Callable[[], None]] = {"sglang": _hook_sglang, "vllm": _hook_vllm}


def _console_script(name: str) -> Callable[[], Any] | None:
    for ep in metadata.entry_points(group="console_scripts"):
        if ep.name == name:
            return ep.load()
    return None


def main() -> None:
    argv: list[str] = json.loads(sys.argv[1])
    if "-m" in argv[1:]:
        at = argv.index("-m", 1)
        module, rest = argv[at + 1], argv[at + 2:]
        engine = module.split(".")[0]
        run: Callable[[], Any] = lambda: runpy.run_module(module, run_name="__main__",
                                                          alter_sys=True)
        sys.argv = [module, *rest]
    else:
        engine = os.path.basename(argv[0])
        entry = _console_script(engine)
        if entry is None:
            _emit({"error": f"{argv[0]}: no console script {engine!r} in this venv"}, 4)
        run = entry
        sys.argv = [argv[0], *argv[1:]]
    if engine not in HOOKS:
        _emit({"error": f"no probe for engine {engine!r}"}, 4)
    try:
        HOOKS[engine]()
        run()
    except SystemExit as e:
        # argparse already printed "usage ... error: ..." to stderr.
        code = e.code if isinstance(e.code, int) else 1
        if code == 0:
            _emit({"error": "the entry exited 0 before its server configuration "
                            "was built (help or version output?)"}, 3)
        sys.stderr.flush()
        os._exit(code)
    except Exception as e:  # the engine's own validation: report it, one line
        _emit({"error": f"{type(e).__name__}: {e}".splitlines()[0]}, 4)
    _emit({"error": "the entry returned without parsing a server argv "
                    "(a module with no __main__ code does nothing under -m)"}, 3)


if __name__ == "__main__":
    main()

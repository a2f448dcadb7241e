"""The one table of `infer-units` commands (pip's commands/__init__.py):
name -> where the command lives, loaded only when it runs.

Hooks are what generated units run, as root, on every start and stop:
argparse mains, `function(argv) -> exit code`, run by helpers/entry.py after
the server's environment is scrubbed, hidden from --help (their man page
section reads `summary`).  Every other command is a click command that the
root group (cli/root.py) loads when it is asked for.  A new command is one
line here."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    module: str             # under infer_units.helpers
    attr: str               # the hook's main, or the click command
    hook: bool = False
    summary: str = ""       # hooks only: click commands carry their own help

    def load(self) -> Any:
        """The hook's main or the click command, its module imported now."""
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.attr)


COMMANDS: dict[str, Command] = {
    "pre-start": Command("hooks.unit", "pre_start", hook=True,
                         summary="ExecStartPre: reap, wait for GPUs and port, P2P self-test."),
    "wait-ready": Command("hooks.unit", "wait_ready", hook=True,
                          summary="ExecStartPost: wait for health; fail at once if the "
                                  "server dies."),
    "known-answer": Command("hooks.unit", "known_answer", hook=True,
                            summary="ExecStartPost: the known-answer check; a mismatch "
                                    "refuses the start."),
    "wait-free": Command("hooks.unit", "wait_free", hook=True,
                         summary="ExecStopPost: wait until the GPUs are free; report what "
                                 "holds them."),
    "liveness-probe": Command("hooks.unit", "liveness_probe", hook=True,
                              summary="infer-units-liveness@<name>.service: probe health; "
                                      "restart the model after [liveness] failures."),
    "group-watch": Command("hooks.unit", "group_watch", hook=True,
                           summary="infer-units-group@<name>.service: restart a rank of a "
                                   "multi-node model whose group lost a rank."),
    "render": Command("cli.render", "render"),
    "check": Command("cli.render", "check"),
    "cat": Command("cli.config", "cat_command"),
    "edit": Command("cli.config", "edit_command"),
    "holders": Command("cli.gpu", "holders"),
    "reap": Command("cli.reap", "reap"),
    "wait-port": Command("cli.gpu", "wait_port"),
    "p2p-check": Command("cli.gpu", "p2p_check"),
    "status": Command("cli.gpu", "status"),
    "drain": Command("cli.gpu", "drain"),
    "resume": Command("cli.gpu", "resume"),
    "doctor": Command("cli.doctor", "doctor"),
    "canary": Command("cli.canary", "canary"),
}

HOOKS: dict[str, Command] = {name: c for name, c in COMMANDS.items() if c.hook}

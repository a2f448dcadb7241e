"""The one table of `infer-units` commands.  helpers/entry.py reads HOOKS
(argparse, no click: they are on every start's path); the click root group
(cli/root.py) reads both, loading each operator command's module only when
that command runs.  This module imports nothing: neither side imports the
other, and a new command is one line here."""

# The commands generated units run: name -> (module under infer_units.helpers,
# function(argv) -> exit code, one line for the man page).  Hidden from --help.
HOOKS: dict[str, tuple[str, str, str]] = {
    "pre-start": ("hooks.unit", "pre_start",
                  "ExecStartPre: reap, wait for GPUs and port, P2P self-test."),
    "wait-ready": ("hooks.unit", "wait_ready",
                   "ExecStartPost: wait for health; fail at once if the server dies."),
    "wait-free": ("hooks.unit", "wait_free",
                  "ExecStopPost: wait until the GPUs are free; report what holds them."),
    "liveness-probe": ("hooks.unit", "liveness_probe",
                       "infer-units-liveness@<name>.service: probe health; restart the model "
                       "after [liveness] failures."),
    "group-watch": ("hooks.unit", "group_watch",
                    "infer-units-group@<name>.service: restart a rank of a multi-node model "
                    "whose group lost a rank."),
}

# Operator commands that run without click (helpers/entry.py; their click
# command, built from the same argparse parser, answers --help): name ->
# (module under infer_units.helpers, main(argv) -> exit code, parser() -> its
# argparse parser, the command(**options) -> exit code that main calls).
FAST: dict[str, tuple[str, str, str, str]] = {
    "reap": ("hooks.reap", "main", "parser", "reap"),
}

# The operator commands: name -> (module under infer_units.helpers, the click
# command's attribute there).
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("cli.render", "render"),
    "check": ("cli.render", "check"),
    "cat": ("cli.config", "cat_command"),
    "edit": ("cli.config", "edit_command"),
    "holders": ("cli.gpu", "holders"),
    "wait-port": ("cli.gpu", "wait_port"),
    "p2p-check": ("cli.gpu", "p2p_check"),
    "status": ("cli.gpu", "status"),
    "drain": ("cli.gpu", "drain"),
    "resume": ("cli.gpu", "resume"),
    "doctor": ("cli.doctor", "doctor"),
}

# Commands that ask NVML about --gpus first thing: entry.py begins NVML's
# init and the GPUs' attach in a thread (facts/gpus.warm_nvml) while their
# modules load.
NVML_FIRST: frozenset[str] = frozenset({"reap", "holders", "pre-start"})

# Hooks that ask systemd first thing over its private bus (wait-free: is this
# stop half of a restart?): entry.py opens the connection in a thread
# (facts/systemd.warm_bus) while their modules load.  The connect is PID 1's
# accept and AUTH, 1.5-2 ms on every restart's stop (bench/restart_bench.py).
BUS_FIRST: frozenset[str] = frozenset({"wait-free"})

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
                       "<name>-liveness.service: probe health; restart the model after "
                       "[liveness] failures."),
}

# The operator commands: name -> (module under infer_units.helpers, the click
# command's attribute there).
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("cli.render", "render"),
    "check": ("cli.render", "check"),
    "cat": ("cli.config", "cat_command"),
    "edit": ("cli.config", "edit_command"),
    "holders": ("cli.gpu", "holders"),
    "reap": ("cli.gpu", "reap"),
    "wait-port": ("cli.gpu", "wait_port"),
    "p2p-check": ("cli.gpu", "p2p_check"),
    "status": ("cli.gpu", "status"),
    "drain": ("cli.gpu", "drain"),
    "resume": ("cli.gpu", "resume"),
    "doctor": ("cli.doctor", "doctor"),
}

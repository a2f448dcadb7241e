"""`infer-units reap`: the operator's command, parsed here with hooks/args.py's
parser as the unit hooks are, because it is timed end to end: it is what restart
scripts run between a stop and a start, in place of SGLang's killall.py
(DESIGN.md "Performance goals": 20x faster than it on the same holders).
click's import alone was 36 ms of a 10 ms interpreter start on the H200
(2026-12-02, python3 -IS; bench/reap_bench.py).

The options are declared once, in parser(): cli/root.py builds the click
command from it (cli/options.from_argparse), so --help, the man page, the README's table and shell
completion read the same options, defaults and help (helpers/entry.py sends
`reap --help` to click, everything else here)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

from ...generator import settings
from .. import argtypes, exitcodes
from ..argtypes import unit_name
from ..jsonout import echo_json, json_error, want_json
from .args import Parser, checked

PROG = "infer-units reap"


def _say(message: str) -> None:
    print(f"infer-units: {message}", file=sys.stderr, flush=True)


def _die(message: str, code: int = exitcodes.CONFIG_ERROR) -> NoReturn:
    """A user error: one line, that exit code (and under --json its document)."""
    _say(message)
    json_error(message, code)
    sys.exit(code)


class _Parser(Parser):
    def report(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        json_error(line, exitcodes.CONFIG_ERROR)




def _span(key: str) -> str:
    """A settings default as --help shows it ("10s")."""
    from ...generator.durations import format_seconds
    return format_seconds(settings.default(key))


def parser() -> Parser:
    p = _Parser(prog=PROG, description="Reap the users of GPUs and wait until they are free.")
    p.add_argument("--gpus", dest="selector", required=True, metavar="SEL",
                   help='"0,1", "GPU-…", PCI ids, or "all".')
    p.add_argument("--unit", type=checked(argtypes.unit), default=None,
                   help="The service doing the reaping (its cgroup is its own).")
    p.add_argument("--foreign", choices=settings.REAP_FOREIGN,
                   default=settings.default("reap.foreign"),
                   help="Processes of no infer-units service: kill them, wait for them, "
                        "or exit 2.")
    p.add_argument("--term-grace", type=checked(argtypes.duration),
                   default=_span("reap.term-grace"), help="Time from SIGTERM to SIGKILL.")
    p.add_argument("--timeout", type=checked(argtypes.duration),
                   default=_span("reap.timeout"), help="Overall limit after the grace.")
    p.add_argument("--ignore", action="append", default=[], metavar="NAME",
                   help="Process name never touched, beyond the built-ins (repeatable).")
    p.add_argument("--env-file", default=None, metavar="PATH",
                   help="Write CUDA_VISIBLE_DEVICES (UUIDs) here.")
    p.add_argument("--dry-run", action="store_true", help="Say what would be done; touch nothing.")
    p.add_argument("--json", dest="as_json", action="store_true",
                   help="Machine-readable output.")
    return p


def reap(selector: str, unit: str | None, foreign: str, term_grace: float, timeout: float,
         ignore: list[str] | tuple[str, ...], env_file: str | None, dry_run: bool,
         as_json: bool) -> int:
    """The command itself, whichever parser read its options."""
    from ..act.reaper import Reaper, ReapPolicy
    from ..facts.gpumemory import chosen
    from ..facts.gpus import GpuError
    policy = ReapPolicy(foreign=foreign, term_grace=term_grace,
                        timeout=timeout, ignore=tuple(ignore), dry_run=dry_run)
    if env_file is not None:
        # Before any work: an env file we could not update later is exit 1 now.
        from ..act.envfile import EnvFileError, read_env_file
        try:
            read_env_file(env_file)
        except EnvFileError as e:
            _die(str(e))
    try:
        b, gpus = chosen(selector)
    except GpuError as e:
        _die(str(e))
    result = Reaper(b, gpus, (unit_name(unit) if unit else None), policy).run()
    if env_file and not dry_run and result.exit_code == exitcodes.CLEAN:
        from ..act.envfile import EnvFileError, write_visible_devices
        try:
            write_visible_devices(env_file, gpus)
        except EnvFileError as e:
            _die(str(e))
    if as_json:
        echo_json(result.as_json())
    else:
        sent = len(result.actions)
        _say(f"reap GPU {','.join(str(g.index) for g in gpus)}: "
             f"{result.message} after {result.seconds * 1000:.0f} ms"
             + (f", {sent} signal(s) sent" if sent else ""))
    if not dry_run:
        from ..act.metrics import record_reap
        record_reap((unit_name(unit) if unit else None), result)
    return result.exit_code


def main(argv: list[str]) -> int:
    """`infer-units reap ARGS` (helpers/entry.py): one line and exit 1 for a
    usage error, one JSON document on every path under --json."""
    want_json(argv)
    p = parser()
    # An unknown option is named before a missing one, as click does.
    required = [a for a in p._actions if a.required]
    for action in required:
        action.required = False
    args = p.parse_args(argv)
    missing = [a.option_strings[0] for a in required if getattr(args, a.dest) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    try:
        return reap(**vars(args))
    except KeyboardInterrupt:   # Ctrl-C: one line and one document, as click's Abort was
        _say("aborted")
        json_error("aborted", exitcodes.CONFIG_ERROR)
        return exitcodes.CONFIG_ERROR
    # Anything else unexpected: entry.py's last line of defence (its line and,
    # under --json, the document).

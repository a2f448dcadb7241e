"""`infer-units doctor`: the host, GPU and model checks (doctor.py, health.py)."""

from __future__ import annotations

import sys

import click

from .cli import complete_model_names, echo_json, main


@main.command()
@click.argument("names", nargs=-1, shell_complete=complete_model_names)
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: every finding with its level, fact, fix and source.")
@click.option("--verbose", "-v", is_flag=True, help="List the ok findings too.")
@click.option("--import", "do_import", is_flag=True,
              help="With NAMES: import each engine (as the model's user) instead of only "
                   "locating it; takes as long as the engine's import (seconds).")
@click.option("--write-metrics", is_flag=True,
              help="Also store the GPU findings for the metrics file and `status` (root; "
                   "a timer running this keeps node_exporter's gauges fresh).")
@click.option("--root-dir", metavar="DIR", default=None,
              help="Read the kernel's /proc, /sys and /dev under DIR (a test's fake tree, a "
                   "copy taken from another host).  [default: /]")
def doctor(names: tuple[str, ...], as_json: bool, verbose: bool, do_import: bool,
           write_metrics: bool, root_dir: str | None) -> None:
    """Check the host, its GPUs and the models NAMES: what decides whether they start.

    Each finding is ok, warning, error or unknown (not readable here: never
    ok), with the fact read and the fix.  Exit 0 when no error, 2 when any
    check is an error (pre-start refuses a model's start on an error of its
    GPUs), 1 for an unknown name."""
    from .doctor import collect, table
    report = collect(list(names), root_dir, do_import)
    if write_metrics:
        from .health import Finding, Report
        from .metrics import record_gpu_health
        every = report["host"] + [f for g in report["gpus"] for f in g["findings"]]
        record_gpu_health(Report([Finding(**f) for f in every], report["driver"]))
    if as_json:
        echo_json(report)
    else:
        click.echo(table(report, verbose))
    sys.exit(report["exit"])

"""`python3 -m infer_units ...` is the `infer-units` CLI."""

from infer_units.helpers.cli import main

main()

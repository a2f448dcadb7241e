"""`python3 -m infer_units ...` is the `infer-units` command."""

from infer_units.helpers.entry import main

main()

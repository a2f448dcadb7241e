"""`python3 -m infer_units ...` is the `infer-units` command, run by the tests
and by hand: the hooks keep the caller's environment here (the installed CLI,
which units run, scrubs it: helpers/hookenv.py)."""

from infer_units.helpers.entry import main

main(scrub_hooks=False)

"""Model files to systemd units.  Kept free of heavy imports: the generator runs
on every daemon-reload and at boot (see bench/generator_bench.py)."""

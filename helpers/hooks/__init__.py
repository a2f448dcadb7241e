"""The commands generated units run (pre-start, wait-ready, wait-free,
liveness-probe): argparse, never click (they are on every start's path)."""

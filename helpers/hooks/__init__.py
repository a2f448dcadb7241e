"""The commands generated units run (pre-start, wait-ready, wait-free,
liveness-probe, group-watch): argparse (hooks/parser.py), never click."""

"""The commands generated units run (pre-start, wait-ready, wait-free,
liveness-probe): hooks/args.py's parser, never click (they are on every
start's path)."""

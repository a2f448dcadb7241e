"""Exit codes are part of the contract (DESIGN.md, "Helper commands")."""

CLEAN = 0          # done / GPUs clean
CONFIG_ERROR = 1   # usage or config error
BLOCKED = 2        # GPU used by another infer-units service, or foreign = "fail"
TIMED_OUT = 3      # timed out with holders left

"""The exit codes of every `infer-units` command and hook: part of the
contract (README, "Exit codes"; the man page's EXIT STATUS)."""

CLEAN = 0          # done / GPUs clean
CONFIG_ERROR = 1   # usage or config error
BLOCKED = 2        # GPU used by another infer-units service, foreign = "fail", drained, health
TIMED_OUT = 3      # timed out with holders left

# What each code means, for the journal line of a hook that fails: systemd
# names exit statuses after their LSB/BSD meanings (2 INVALIDARGUMENT,
# 3 NOTIMPLEMENTED), which say nothing of ours.
MEANING = {
    CONFIG_ERROR: "usage or configuration error",
    BLOCKED: "blocked",
    TIMED_OUT: "timed out with holders left",
}


def explained(code: int) -> str:
    """ "exit 3 = timed out with holders left" (empty for 0 and codes not ours)."""
    meaning = MEANING.get(code)
    return f"exit {code} = {meaning}" if meaning else ""

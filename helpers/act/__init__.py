"""Acting on the facts and decisions: reaping, waiting on pids, readiness,
rendezvous, drain, the P2P self-test, the env file, liveness, metrics."""

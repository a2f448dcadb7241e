"""The operator commands (`infer-units render|check|holders|reap|...`): click."""

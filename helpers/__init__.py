"""Runtime helpers behind the unit's hooks and the `infer-units` CLI."""

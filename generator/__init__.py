"""Model files to systemd units: the loader, the settings table, the model,
the renderer and the generator entry point (docs/architecture.md)."""

"""jinja2 templates of the generated units (service.j2, engines/*.j2, the
liveness drop-ins), rendered by generator/render.py, and the static units
the package installs (systemd/)."""

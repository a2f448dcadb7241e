"""jinja2 templates of the generated units (service.j2, engines/*.j2) and
compiled.py, the form of them the generator fills without importing jinja2."""

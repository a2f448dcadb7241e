"""infer-units: one declarative file per model becomes a systemd service that
cleans its GPUs on every stop and start."""

import os as _os

__version__ = "0.2.0"

# Installed, setuptools' package_dir puts generator/, helpers/ and units/ inside
# this package.  In a source checkout they sit beside it (the design card's
# layout), so the checkout root joins the package path.
_here = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_here, "generator")):
    __path__.append(_os.path.dirname(_here))  # type: ignore[name-defined]

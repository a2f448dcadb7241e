"""infer-units: one declarative file per model becomes a systemd service that
cleans its GPUs on every stop and start.

The design card's folders (generator/, helpers/, units/, vendor/) sit at the
checkout's root; installed they are subpackages of this one (setup.cfg's
package_dir).  The checkout holds committed symlinks infer_units/generator ->
../generator (and helpers, units, _vendor -> ../vendor), so a checkout imports
exactly the installed tree under the installed names: tests exercise the
product, and a type checker sees each file once."""

__version__ = "0.2.0"

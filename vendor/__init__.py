"""Privately bundled third-party modules.  packaging/build-deb puts NVIDIA's
pynvml.py (nvidia-ml-py, not in Debian) here; a source checkout has none and
falls back to an installed pynvml or to /proc."""

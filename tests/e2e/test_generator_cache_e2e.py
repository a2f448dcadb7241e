"""The generator's cache (generator/cache.py) under real systemd: daemon-reload
replays the last run only while nothing it read changed; a model file
rewritten with other bytes under the same size and mtime is seen at once."""

from __future__ import annotations

import pytest

from .e2e_support import add_model, show

pytestmark = pytest.mark.e2e

CACHE = "/run/infer-units/generator.cache"


def test_daemon_reload_sees_an_edit_that_keeps_size_and_mtime(box) -> None:
    # No GPU: the others' models hold them all (a clash is logged, and a run
    # that logged is never stored).
    add_model(box, "cached", 'engine = "command"\ncommand = ["/usr/local/bin/fake-engine", '
              '"--port", "18055"]\nport = 18055\n[env]\nCACHE_MARK = "aaaa"\n')
    box.sh("systemctl daemon-reload && systemctl daemon-reload")
    assert "CACHE_MARK=aaaa" in show(box, "cached.service", "Environment")["Environment"]
    clean = box.sh("infer-units check", check=False).returncode == 0
    print(f"configuration clean, so the cache is checked too: {clean}")
    if clean:
        # Nothing logged: the second reload was stored (or replayed); root's alone.
        assert box.sh(f"stat -c %U:%G:%a {CACHE}").stdout.strip() == "root:root:600"
    before = box.sh(f"stat -c %i {CACHE}", check=False).stdout.strip()
    if clean:
        # Nothing changed: the next reload replays (a full run would store anew),
        # so systemd's environment for generators is the same at each reload.
        box.sh("systemctl daemon-reload")
        assert box.sh(f"stat -c %i {CACHE}").stdout.strip() == before
        assert "CACHE_MARK=aaaa" in show(box, "cached.service", "Environment")["Environment"]
    # Same size, same mtime, other bytes.
    box.sh("f=/etc/infer-units/cached.toml; t=$(stat -c %y $f); "
           "sed -i s/aaaa/bbbb/ $f; touch -d \"$t\" $f")
    box.sh("systemctl daemon-reload")
    assert "CACHE_MARK=bbbb" in show(box, "cached.service", "Environment")["Environment"]
    if clean:
        # A full run, stored anew: the cache file was replaced.
        assert box.sh(f"stat -c %i {CACHE}").stdout.strip() != before
    box.sh("rm /etc/infer-units/cached.toml && systemctl daemon-reload")
    assert show(box, "cached.service", "LoadState")["LoadState"] == "not-found"

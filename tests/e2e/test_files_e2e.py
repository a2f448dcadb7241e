"""Files across the trust boundary under real systemd (README "Trust model",
generator/atomicfile.py): the metrics textfile attack (below) through a
real unit's root hooks, and their directories under a unit's `UMask=0000`.

The host is laid out as Debian's prometheus-node-exporter leaves it: the
textfile directory is root's 0755, its parent belongs to the exporter's
account.  That account swaps the directory for its own and plants symlinks to
a root-only 0600 file at every name the next hooks' pids would give a
temporary file."""

from __future__ import annotations

import pytest

from .e2e_support import add_model, model_toml, show

pytestmark = pytest.mark.e2e

ACCOUNT = "iu-prom"
PARENT = "/var/lib/iu-prom"
TEXTFILE_DIR = f"{PARENT}/node-exporter"
VICTIM = "/root/iu-victim"
SECRET = "root only\n"

SWAP_AND_PLANT = r"""
import os, sys
d, target = sys.argv[1], sys.argv[2]
os.rename(d, d + ".old")
os.mkdir(d)
last = int(open("/proc/sys/kernel/ns_last_pid").read())
top = int(open("/proc/sys/kernel/pid_max").read())
for i in range(1, 3000):
    os.symlink(target, f"{d}/infer-units.prom.{(last + i) % top}.tmp")
os.symlink(target, f"{d}/infer-units.prom.tmp")
os.symlink(target, f"{d}/infer-units.prom")
"""


@pytest.fixture
def attacked(box):
    box.sh(f"id {ACCOUNT} >/dev/null 2>&1 || useradd --system --no-create-home {ACCOUNT}; "
           f"rm -rf {PARENT} && mkdir -p {TEXTFILE_DIR} && chown {ACCOUNT}: {PARENT} && "
           f"chmod 0755 {TEXTFILE_DIR} && printf '{SECRET}' > {VICTIM} && chmod 0600 {VICTIM}")
    box.write("/usr/local/share/iu-plant.py", SWAP_AND_PLANT)
    text = model_toml("filesm", [4], 18321, env={"INFER_UNITS_METRICS_DIR": TEXTFILE_DIR})
    text = text.replace('[service]\nRestartSec = "1s"', '[service]\nRestartSec = "1s"\nUMask = "0000"')
    assert 'UMask = "0000"' in text
    add_model(box, "filesm", text)
    # No runtime directory yet: the hooks make it, under the unit's umask 0000.
    box.sh("systemctl daemon-reload && rm -rf /run/infer-units")
    yield
    box.sh("systemctl stop filesm; systemctl reset-failed filesm; rm -f /etc/infer-units/filesm.toml "
           f"{VICTIM} /usr/local/share/iu-plant.py; rm -rf {PARENT}; systemctl daemon-reload", check=False)


def test_the_metrics_attack_through_a_real_units_hooks(box, attacked) -> None:
    plant = box.sh(f"setpriv --reuid={ACCOUNT} --regid={ACCOUNT} --clear-groups "
                   f"python3 /usr/local/share/iu-plant.py {TEXTFILE_DIR} {VICTIM}", check=False)
    assert plant.returncode == 0, plant.stderr
    assert box.sh("systemctl start filesm", check=False).returncode == 0, box.journal("filesm")
    assert show(box, "filesm.service", "ActiveState")["ActiveState"] == "active"
    box.sh("systemctl stop filesm")        # ExecStopPost writes metrics too
    assert box.sh(f"cat {VICTIM}").stdout == SECRET, "a root hook wrote through a planted link"
    assert box.sh(f"stat -c '%a %U' {VICTIM}").stdout.split() == ["600", "root"]
    journal = box.journal("filesm.service")
    assert (f"metrics not written: refusing {PARENT}: owned by {ACCOUNT}" in journal), journal
    # The unit ran with UMask=0000: our directories have their fixed modes anyway.
    dirs = box.sh("find /run/infer-units -type d -printf '%m %u %p\\n'").stdout.splitlines()
    files = box.sh("find /run/infer-units -type f -printf '%m %u %p\\n'").stdout.splitlines()
    assert {"/run/infer-units", "/run/infer-units/gpu", "/run/infer-units/state"} <= \
        {line.split()[2] for line in dirs}, dirs
    # Claim locks are root's alone: 0700 and 0600 under gpu/.
    def expected(path: str, directory: bool) -> list[str]:
        private = path == "/run/infer-units/gpu" or path.startswith("/run/infer-units/gpu/")
        return ["700" if private else "755", "root"] if directory else \
            ["600" if private else "644", "root"]
    assert all(line.split()[:2] == expected(line.split()[2], True) for line in dirs), dirs
    assert files and all(line.split()[:2] == expected(line.split()[2], False)
                         for line in files), files
    assert any(line.split()[2].startswith("/run/infer-units/gpu/") for line in files), files
    # and the exporter's account cannot drop a model file into it
    tried = box.sh(f"setpriv --reuid={ACCOUNT} --regid={ACCOUNT} --clear-groups "
                   "sh -c ': > /run/infer-units/evil.toml'", check=False)
    assert tried.returncode != 0 and box.sh("test -e /run/infer-units/evil.toml",
                                             check=False).returncode != 0

"""Several hosts for one multi-node model: bookworm containers with the .deb
installed, booted with real systemd, each in a network namespace of its own,
joined by a bridge (10.77.0.0/24) in a namespace of its own (so the machine's
firewall never sees the traffic), named gpu-a, gpu-b, gpu-c like the hosts of
a [nodes] model, each with its own fake GPUs.

One root is prepared (booted on the machine's network, the .deb installed with
apt, fakes in place) and every host boots an overlay of it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .container import SYSTEM_PATH, Container
from .e2e_support import install_fake_gpus, install_fakes

HOSTS = {"gpu-a": "10.77.0.1", "gpu-b": "10.77.0.2", "gpu-c": "10.77.0.3"}
SWITCH = "iu-switch"        # the namespace holding the bridge


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True,
                          env={"PATH": SYSTEM_PATH})
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {done.stderr.strip()}")


class Network:
    def up(self) -> None:
        self.down()
        _ip("netns", "add", SWITCH)
        _ip("-n", SWITCH, "link", "add", "br0", "type", "bridge")
        _ip("-n", SWITCH, "link", "set", "br0", "up")
        for n, (name, address) in enumerate(HOSTS.items()):
            ns = f"iu-{name}"
            _ip("netns", "add", ns)
            _ip("link", "add", f"iu{n}h", "netns", SWITCH, "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            _ip("-n", SWITCH, "link", "set", f"iu{n}h", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def down(self) -> None:
        for ns in [SWITCH, *(f"iu-{name}" for name in HOSTS)]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True,
                           env={"PATH": SYSTEM_PATH})


class Group:
    """The hosts, booted; `group[name]` is that host's Container."""

    def __init__(self, suite: str = "bookworm") -> None:
        self.suite = suite
        self.dir = Path(tempfile.mkdtemp(prefix="iu-group-"))
        self.net = Network()
        self.hosts: dict[str, Container] = {}
        self.mounts: list[Path] = []

    def __getitem__(self, name: str) -> Container:
        return self.hosts[name]

    def boot(self, deb: Path, root_of_tree: Path) -> None:
        template = Container(self.suite)
        template.boot()
        try:
            done = template.install_deb(deb)
            assert done.returncode == 0, done.stdout + done.stderr
            install_fakes(template, root_of_tree)
            install_fake_gpus(template)
            template.write("/etc/hosts", "127.0.0.1 localhost\n" + "".join(
                f"{address} {name}\n" for name, address in HOSTS.items()))
        finally:
            template._stop()
        self.template = template
        self.net.up()
        for name in HOSTS:
            root = self._overlay(template.root, name)
            (root / "etc/hostname").write_text(name + "\n")
            host = Container(self.suite, nspawn_args=(
                f"--network-namespace-path=/run/netns/iu-{name}", f"--hostname={name}",
                f"--machine=iu-{name}"))
            host.boot_root(root)
            self.hosts[name] = host

    def _overlay(self, lower: Path, name: str) -> Path:
        upper, work, merged = (self.dir / name / d for d in ("upper", "work", "root"))
        for d in (upper, work, merged):
            d.mkdir(parents=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
                       check=True, env={"PATH": SYSTEM_PATH})
        self.mounts.append(merged)
        return merged

    def shutdown(self) -> None:
        for host in self.hosts.values():
            host._stop()
        for merged in self.mounts:
            subprocess.run(["umount", "-l", str(merged)], env={"PATH": SYSTEM_PATH})
        self.net.down()
        if getattr(self, "template", None) is not None:
            self.template.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)

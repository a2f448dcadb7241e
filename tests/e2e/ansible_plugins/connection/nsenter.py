"""An Ansible connection into a container booted by tests/e2e/container.py.

The controller is this machine; the managed host is the container's systemd,
reached with nsenter into all its namespaces (its own network namespace
included, so servers started there bind the container's ports).  No sshd and
no Python beyond the container's own python3 are needed on the host.
ansible_host is the pid of the container's systemd.
"""

from __future__ import annotations

import subprocess

from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

DOCUMENTATION = """
name: nsenter
short_description: run tasks inside a booted systemd-nspawn container (tests)
description:
  - Commands run through nsenter in every namespace of the container's PID 1.
options:
  remote_addr:
    description: The host pid of the container's systemd.
    vars:
      - name: ansible_host
"""

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class Connection(ConnectionBase):
    transport = "nsenter"
    has_pipelining = True

    def _enter(self, script: str, *args: str) -> list[str]:
        # HOME: Ansible's remote temporary directory starts with ~ (root's).
        return ["nsenter", "-t", str(self.get_option("remote_addr")), "-a", "/usr/bin/env", "-i",
                "HOME=/root", f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8", "/bin/sh", "-c", script, "sh",
                *args]

    def _connect(self) -> Connection:
        self._connected = True
        return self

    def exec_command(self, cmd: str, in_data: bytes | None = None,
                     sudoable: bool = True) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        display.vvv(f"EXEC {cmd}", host=self._play_context.remote_addr)
        done = subprocess.run(self._enter(cmd), input=in_data or b"", capture_output=True)
        return done.returncode, done.stdout, done.stderr

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        display.vvv(f"PUT {in_path} TO {out_path}", host=self._play_context.remote_addr)
        with open(in_path, "rb") as source:
            done = subprocess.run(self._enter('cat > "$1"', out_path), stdin=source,
                                  capture_output=True)
        if done.returncode != 0:
            raise OSError(f"put {out_path}: {done.stderr.decode(errors='replace')}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        with open(out_path, "wb") as target:
            done = subprocess.run(self._enter('cat "$1"', in_path), stdout=target,
                                  stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise OSError(f"fetch {in_path}: {done.stderr.decode(errors='replace')}")

    def close(self) -> None:
        self._connected = False

"""A model's compile caches under real systemd (docs/engines.md, "Compile
caches"; docs/trust.md): CacheDirectory=infer-units/<model> is its server's
account's, 0700, kept across restarts, and a directory another account left
there is taken from it before the server runs."""

from __future__ import annotations

import json

import pytest

from .e2e_support import add_model, show

pytestmark = pytest.mark.e2e

NAME, PORT = "cachem", 18731
ACCOUNT = "iu-cache"            # a system account with no home, as a service has
OTHER = "iu-cache-other"
DIR = f"/var/cache/infer-units/{NAME}"
ELSEWHERE = "/srv/iu-cache-elsewhere"
# The server writes where the unit points torch's inductor cache (and says who
# it is), then becomes the fake engine: its MainPID and /health are the server's.
SCRIPT = ('mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && id -un >> "$TORCHINDUCTOR_CACHE_DIR/starts" '
          f'&& exec /usr/local/bin/fake-engine --port {PORT} --load 0.2')


@pytest.fixture
def cached(box):
    box.sh(f"for u in {ACCOUNT} {OTHER}; do id $u >/dev/null 2>&1 || "
           "useradd --system --no-create-home $u; done; "
           f"rm -rf {DIR} {ELSEWHERE}")
    add_model(box, NAME, "\n".join([
        'engine = "command"', f"command = {json.dumps(['/bin/sh', '-c', SCRIPT])}",
        f"port = {PORT}", f'user = "{ACCOUNT}"', "", "[ready]", 'timeout = "60s"',
        'interval = "100ms"', "", "[service]", 'RestartSec = "1s"']) + "\n")
    box.sh("systemctl daemon-reload")
    yield
    box.sh(f"systemctl stop {NAME}; systemctl reset-failed {NAME}; "
           f"rm -f /etc/infer-units/{NAME}.toml; rm -rf {DIR} {ELSEWHERE}; "
           "systemctl daemon-reload", check=False)


def started(box) -> None:
    assert box.sh(f"systemctl start {NAME}", check=False).returncode == 0, \
        box.journal(f"{NAME}.service")[-3000:]
    assert show(box, f"{NAME}.service", "ActiveState")["ActiveState"] == "active"


def mode_owner(box, path: str) -> list[str]:
    return box.sh(f"stat -c '%a %U %F' {path}").stdout.strip().split(maxsplit=2)


def server_env(box) -> dict[str, str]:
    pid = show(box, f"{NAME}.service", "MainPID")["MainPID"]
    raw = box.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_the_cache_is_the_servers_own_and_survives_a_restart(box, cached) -> None:
    started(box)
    assert mode_owner(box, DIR) == ["700", ACCOUNT, "directory"]
    assert mode_owner(box, "/var/cache/infer-units") == ["755", "root", "directory"]
    env = server_env(box)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == f"{DIR}/torchinductor"
    assert env["VLLM_CACHE_ROOT"] == f"{DIR}/vllm" and "XDG_CACHE_HOME" not in env
    assert box.sh(f"cat {DIR}/torchinductor/starts").stdout.split() == [ACCOUNT]
    pid = show(box, f"{NAME}.service", "MainPID")["MainPID"]
    box.sh(f"systemctl restart {NAME}")
    assert show(box, f"{NAME}.service", "MainPID")["MainPID"] != pid
    # What the first start wrote is there for the second.
    assert box.sh(f"cat {DIR}/torchinductor/starts").stdout.split() == [ACCOUNT, ACCOUNT]
    assert mode_owner(box, DIR) == ["700", ACCOUNT, "directory"]
    # No other account can write into it, or read it.
    tried = box.sh(f"setpriv --reuid={OTHER} --regid={OTHER} --clear-groups "
                   f"sh -c ': > {DIR}/torchinductor/planted'", check=False)
    assert tried.returncode != 0


def test_a_directory_another_account_left_is_taken_from_it(box, cached) -> None:
    box.sh(f"mkdir -p {DIR}/torchinductor && echo planted > {DIR}/torchinductor/old && "
           f"chown -R {OTHER}: {DIR} && chmod 0777 {DIR}")
    started(box)
    # systemd chowns the whole tree to the server's account and sets 0700:
    # the other account can no longer write it (what it left stays: trust.md).
    assert mode_owner(box, DIR) == ["700", ACCOUNT, "directory"]
    assert mode_owner(box, f"{DIR}/torchinductor/old")[1] == ACCOUNT
    assert box.sh(f"cat {DIR}/torchinductor/starts").stdout.split() == [ACCOUNT]


def test_a_symlink_in_its_place_fails_the_start(box, cached) -> None:
    box.sh(f"mkdir -p {ELSEWHERE} && chown {OTHER}: {ELSEWHERE} && chmod 0777 {ELSEWHERE} && "
           f"ln -s {ELSEWHERE} {DIR}")
    assert box.sh(f"systemctl start {NAME}", check=False).returncode != 0
    # systemd refuses the link (status 239/CACHE_DIRECTORY) before any of the
    # unit's commands runs, and leaves its target as it was.
    assert "CACHE_DIRECTORY" in box.journal(f"{NAME}.service")
    assert mode_owner(box, ELSEWHERE) == ["777", OTHER, "directory"]
    assert box.sh(f"ls -A {ELSEWHERE}").stdout == ""

"""Units are written atomically: on a full disk the old unit (or none) stays,
never a truncated or empty one (an empty unit is a masked unit to systemd).

Two real ways to run out of space: a 64 KiB tmpfs filled to the brim (root
only), and RLIMIT_FSIZE on the generator process (write() fails with EFBIG)."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from ..support import PYTHON, base_env

# A unit well over 1 KiB: the env table makes it long.
MODEL = ('engine = "command"\ncommand = ["/opt/srv/serve"]\ngpus = [0]\n'
         '[install]\nWantedBy = "multi-user.target"\n[env]\n'
         + "".join(f'VAR_{i} = "{"x" * 40}"\n' for i in range(40)))
OLD = "# the unit of an earlier run\n[Service]\nExecStart=/bin/old\n"


def config(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "big.toml").write_text(MODEL)
    return etc


def generate(out: Path, etc: Path, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.run([PYTHON, "-m", "infer_units.generator.main", str(out)],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          env=base_env(INFER_UNITS_CONFIG_PATH=str(etc)))


def whole_unit(tmp_path: Path, etc: Path) -> str:
    """The unit as the generator writes it with room to spare: what a written
    unit must equal, byte for byte (not merely start and end like it)."""
    fresh = tmp_path / "fresh"
    fresh.mkdir(exist_ok=True)
    assert generate(fresh, etc).stderr == ""
    return (fresh / "big.service").read_text()


def leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob(".*"))


def test_file_size_limit_keeps_the_old_unit(tmp_path: Path) -> None:
    etc = config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "big.service").write_text(OLD)
    done = generate(out, etc, fsize=1024)
    assert done.returncode == 0
    assert f"{etc}/big.toml: cannot write big.service: File too large" in done.stderr
    assert (out / "big.service").read_text() == OLD
    assert leftovers(out) == []
    # Without an old unit: none at all, not an empty one.
    (out / "big.service").unlink()
    done = generate(out, etc, fsize=1024)
    assert not (out / "big.service").exists() and leftovers(out) == []
    # And with room, the new unit replaces the old one whole.
    (out / "big.service").write_text(OLD)
    done = generate(out, etc)
    assert done.stderr == ""
    text = (out / "big.service").read_text()
    whole = whole_unit(tmp_path, etc)
    assert text.startswith("# Automatically generated") and text == whole and len(whole) > 1024
    assert os.readlink(out / "multi-user.target.wants/big.service") == "../big.service"
    assert leftovers(out) == []


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", f"iu-test-{uuid.uuid4().hex[:8]}",
                           str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill(directory: Path) -> None:
    """Write until the filesystem is full (unbuffered: every byte that fits lands)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_full_tmpfs_keeps_the_old_unit_or_none(tmp_path: Path, tiny_tmpfs: Path) -> None:
    etc = config(tmp_path)
    out = tiny_tmpfs / "out"
    out.mkdir()
    (out / "big.service").write_text(OLD)
    fill(tiny_tmpfs)
    done = generate(out, etc)
    assert done.returncode == 0
    assert f"{etc}/big.toml: cannot write big.service: No space left on device" in done.stderr
    assert (out / "big.service").read_text() == OLD
    assert leftovers(out) == []
    (out / "big.service").unlink()
    fill(tiny_tmpfs)            # the old unit's page is free again: take it
    done = generate(out, etc)
    assert "No space left on device" in done.stderr
    assert not (out / "big.service").exists() and leftovers(out) == []
    # Room again: written whole.
    (tiny_tmpfs / "filler").unlink()
    done = generate(out, etc)
    assert done.stderr == "" and (out / "big.service").read_text() == whole_unit(tmp_path, etc)


def test_write_new_names_the_file_whole_and_leaves_existing_names_to_write(tmp_path: Path) -> None:
    """Dir.write_new (the generator's writes): into a free name, the file appears
    whole with its mode whatever the umask; a name already taken is write()'s:
    a regular file is replaced, a planted link or FIFO is refused and left as
    it was (nothing written through it, no hang), and nothing is left over."""
    from infer_units.generator.atomicfile import UnsafePath, open_dir
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (out / "link.service").symlink_to(victim)
    os.mkfifo(out / "fifo.service")
    (out / "old.service").write_text(OLD)
    old_umask = os.umask(0o077)
    try:
        with open_dir(str(out)) as d:
            d.write_new("new.service", "new\n")
            d.write_new("old.service", b"replaced\n")
            for name in ("link.service", "fifo.service"):
                with pytest.raises(UnsafePath, match="not a regular file"):
                    d.write_new(name, "evil\n")
            with pytest.raises(ValueError):
                d.write_new("../escape.service", "x\n")
    finally:
        os.umask(old_umask)
    assert (out / "new.service").read_text() == "new\n"
    assert stat.S_IMODE((out / "new.service").stat().st_mode) == 0o644
    assert (out / "old.service").read_text() == "replaced\n"
    assert victim.read_text() == "keep\n" and (out / "link.service").is_symlink()
    assert stat.S_ISFIFO((out / "fifo.service").lstat().st_mode)
    assert not (tmp_path / "escape.service").exists() and leftovers(out) == []


def test_child_directories_are_opened_once_and_closed_with_their_parent(tmp_path: Path) -> None:
    from infer_units.generator.atomicfile import open_dir
    out = tmp_path / "out"
    out.mkdir()
    d = open_dir(str(out))
    wants = d.child("multi-user.target.wants")
    assert d.child("multi-user.target.wants") is wants and wants.fd >= 0
    wants.symlink("a.service", "../a.service")
    d.close()
    assert wants.fd == -1 and d.fd == -1
    assert os.readlink(out / "multi-user.target.wants" / "a.service") == "../a.service"
    assert stat.S_IMODE((out / "multi-user.target.wants").stat().st_mode) == 0o755

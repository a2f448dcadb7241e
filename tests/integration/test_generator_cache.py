"""generator/cache.py: a run whose reads all get the last run's answers writes
the last run's units.  Every case's replayed output is byte for byte the full
run's (and so its golden); any change of what a run reads is a full run; a
cache root alone could have written is the only one read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ..support import run_generator
from ..unit.test_generator_cases import case_names, check_golden, prepare


def tree(out: Path) -> dict[str, str]:
    found = {}
    for path in sorted(out.rglob("*")):
        rel = str(path.relative_to(out))
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            found[rel] = path.read_text(encoding="utf-8")
        else:
            found[rel] = "dir"
    return found


def generate(out: Path, dirs: str, cache: Path, **env: str) -> str:
    shutil.rmtree(out, ignore_errors=True)
    done = run_generator(out, dirs, INFER_UNITS_GENERATOR_CACHE=str(cache), **env)
    assert done.returncode == 0, done.stderr
    return done.stderr


def stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


@pytest.mark.parametrize("case", case_names())
def test_a_replayed_run_writes_exactly_the_full_runs_units(case: str, tmp_path: Path) -> None:
    root, dirs = prepare(case, tmp_path)
    cache, out = tmp_path / "cache" / "generator.cache", tmp_path / "out"
    full_log = generate(out, ":".join(dirs), cache)
    full = tree(out)
    if full_log:
        # A run that logged (errors, conflicts) is never replayed: the next
        # run must log them again.
        assert not cache.exists()
        assert generate(out, ":".join(dirs), cache) == full_log
        return
    assert cache.exists(), "a clean run keeps its result"
    before = stamp(cache)
    assert generate(out, ":".join(dirs), cache) == ""
    assert stamp(cache) == before, "the second run was a full run, not a replay"
    assert tree(out) == full
    check_golden(case, out, root)


def two_models(tmp_path: Path) -> tuple[Path, str]:
    etc = tmp_path / "etc"
    etc.mkdir()
    for i in (1, 2):
        (etc / f"m{i}.toml").write_text(f'engine = "vllm"\nmodel = "/m/{i}"\ngpus = [{i}]\n'
                                        f"port = {8000 + i}\n")
    return etc, str(etc)


def replayed(cache: Path, before: tuple[int, int]) -> bool:
    return cache.exists() and stamp(cache) == before


def test_the_same_bytes_under_the_same_mtime_are_still_read(tmp_path: Path) -> None:
    """Keyed on content: a file rewritten with the same size and mtime but
    other bytes is a full run."""
    etc, dirs = two_models(tmp_path)
    cache, out = tmp_path / "c" / "generator.cache", tmp_path / "out"
    generate(out, dirs, cache)
    before = stamp(cache)
    model = etc / "m1.toml"
    st = model.stat()
    model.write_text(model.read_text().replace("/m/1", "/m/7"))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model.stat().st_size == st.st_size and model.stat().st_mtime_ns == st.st_mtime_ns
    generate(out, dirs, cache)
    assert "/m/7" in (out / "m1.service").read_text()
    assert not replayed(cache, before)


@pytest.mark.parametrize("change", ["drop-in", "host-default", "mask", "new-model", "hostname",
                                    "unit-path"])
def test_any_change_of_what_a_run_reads_is_a_full_run(change: str, tmp_path: Path) -> None:
    etc, dirs = two_models(tmp_path)
    cache, out = tmp_path / "c" / "generator.cache", tmp_path / "out"
    units = tmp_path / "units"
    units.mkdir()
    env = {"INFER_UNITS_UNIT_PATH": str(units)}
    generate(out, dirs, cache, **env)
    before = stamp(cache)
    first = tree(out)
    if change == "drop-in":
        (etc / "m1.toml.d").mkdir()
        (etc / "m1.toml.d" / "50-x.toml").write_text('[ready]\ntimeout = "33min"\n')
    elif change == "host-default":
        (etc / "defaults.toml.d").mkdir()
        (etc / "defaults.toml.d" / "10-x.toml").write_text('[reap]\ntimeout = "17s"\n')
    elif change == "mask":
        (etc / "m2.toml").unlink()
        (etc / "m2.toml").symlink_to("/dev/null")
    elif change == "new-model":
        (etc / "m3.toml").write_text('engine = "vllm"\nmodel = "/m/3"\ngpus = [3]\nport = 8003\n')
    elif change == "hostname":
        env["INFER_UNITS_HOSTNAME"] = "other.example"
    elif change == "unit-path":
        (units / "m2.service").write_text("[Service]\nExecStart=/bin/true\n")
    log = generate(out, dirs, cache, **env)
    if change == "unit-path":
        assert "m2.service already exists" in log and not (out / "m2.service").exists()
    elif change == "hostname":
        assert tree(out) == first       # no [nodes]: the same units, but not a replay
        assert not replayed(cache, before)
    else:
        assert tree(out) != first
        assert not replayed(cache, before)


def test_a_run_into_another_directory_replays_but_not_with_other_arguments(
        tmp_path: Path) -> None:
    """The output directories in argv say where units go, not what they say:
    another directory replays the run.  The number of arguments stays in
    the key (systemd passes three, a person one)."""
    import subprocess

    from ..support import PYTHON, base_env
    if os.geteuid() != 0:
        pytest.skip("the cache is root's: as another user the generator never reads one")
    _etc, dirs = two_models(tmp_path)
    cache, first, second = tmp_path / "c" / "generator.cache", tmp_path / "a", tmp_path / "b"
    generate(first, dirs, cache)
    before = stamp(cache)
    generate(second, dirs, cache)
    assert replayed(cache, before), "a run into another directory was a full run"
    assert tree(second) == tree(first) and "m1.service" in tree(second)
    third = tmp_path / "c3"
    for d in ("normal", "early", "late"):
        (third / d).mkdir(parents=True)
    done = subprocess.run([PYTHON, "-m", "infer_units.generator.main",
                           *(str(third / d) for d in ("normal", "early", "late"))],
                          capture_output=True, text=True, timeout=60,
                          env=base_env(INFER_UNITS_CONFIG_PATH=dirs,
                                       INFER_UNITS_GENERATOR_CACHE=str(cache)))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert tree(third / "normal") == tree(first)
    assert not replayed(cache, before), "three arguments replayed the one-argument run"


def write_bogus_cache(tmp_path: Path) -> tuple[Path, Path, str]:
    """A cache with a real run's key and record, whose units were swapped
    for one an attacker wants (what a writable cache would let them do)."""
    import marshal
    _etc, dirs = two_models(tmp_path)
    cache, out = tmp_path / "c" / "generator.cache", tmp_path / "out"
    generate(out, dirs, cache)
    key, record, _units = marshal.loads(cache.read_bytes())
    cache.write_bytes(marshal.dumps((key, record, (("evil.service", "[Service]\n", ()),))))
    os.chmod(cache, 0o600)
    return cache, out, dirs


def test_the_replay_is_of_what_the_cache_holds(tmp_path: Path) -> None:
    """The check below is not vacuous: a root-owned cache is believed."""
    cache, out, dirs = write_bogus_cache(tmp_path)
    generate(out, dirs, cache)
    assert (out / "evil.service").exists()


@pytest.mark.parametrize("how", ["other-writable", "group-writable", "not-root", "symlink",
                                 "dir-writable", "dir-not-root"])
def test_a_cache_anyone_but_root_could_write_is_ignored(how: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the cache is root's: as another user the generator never reads one")
    cache, out, dirs = write_bogus_cache(tmp_path)
    if how == "other-writable":
        os.chmod(cache, 0o602)
    elif how == "group-writable":
        os.chmod(cache, 0o620)
    elif how == "not-root":
        os.chown(cache, 65534, 65534)
    elif how == "symlink":
        real = cache.with_name("elsewhere")
        cache.rename(real)
        cache.symlink_to(real)
    elif how == "dir-writable":
        os.chmod(cache.parent, 0o777)
    elif how == "dir-not-root":
        os.chown(cache.parent, 65534, 65534)
    generate(out, dirs, cache)
    assert not (out / "evil.service").exists()
    assert (out / "m1.service").exists() and (out / "m2.service").exists()


def test_off_when_empty_and_for_other_users(tmp_path: Path) -> None:
    _etc, dirs = two_models(tmp_path)
    out = tmp_path / "out"
    done = run_generator(out, dirs, INFER_UNITS_GENERATOR_CACHE="")
    assert done.returncode == 0 and (out / "m1.service").exists()
    assert not any(p.name.endswith(".cache") for p in tmp_path.rglob("*"))

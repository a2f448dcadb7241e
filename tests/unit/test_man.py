"""The man pages and the README's command table are generated from the code:
every key of the settings table, every command and option of the click tree,
every unit hook is in them, the roff is clean, and the package installs the
three pages."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from ..support import PYTHON, ROOT, script_env

PAGES = ("infer-units.1", "infer-units.toml.5", "infer-units-generator.8")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("man")
    done = subprocess.run([PYTHON, str(ROOT / "tools/make-man"), str(out)], capture_output=True,
                          text=True, env=script_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(Path(p).name for p in done.stdout.split()) == sorted(PAGES)
    return {name: (out / name).read_text(encoding="utf-8") for name in PAGES}


def roff(text: str) -> str:
    return text.replace("\\", "\\e").replace("-", "\\-")


def test_toml_page_has_every_key_with_its_default(pages: dict[str, str]) -> None:
    from infer_units.generator.durations import format_seconds
    from infer_units.generator.settings import SETTINGS, check_duration
    page = pages["infer-units.toml.5"]
    for s in SETTINGS:
        line = next((l for l in page.splitlines() if l.startswith(f".B {roff(s.key)}")), None)
        assert line is not None, f"infer-units.toml(5) misses {s.key}"
        if s.check is check_duration and s.default is not None:
            assert f'(default: "{format_seconds(s.default)}")' in line.replace("\\-", "-"), line
    assert ".SH EXAMPLES" in page and 'engine = "sglang"' in page


def test_cli_page_has_every_command_option_and_hook(pages: dict[str, str]) -> None:
    from infer_units.helpers.cli.root import all_commands
    from infer_units.helpers.commands import HOOKS
    page = pages["infer-units.1"]
    for name, command in all_commands().items():
        if command.hidden:
            continue
        assert re.search(rf"^\.B {re.escape(roff(name))}\b", page, re.M), name
        for param in command.params:
            if isinstance(param, click.Option):
                assert roff(param.opts[0]) in page, (name, param.opts[0])
    for hook in HOOKS:
        assert f".B {roff(hook)}\n" in page
    assert "DRAIN AND RESUME" in page and "/proc/modules" in page


@pytest.mark.skipif(not shutil.which("groff"), reason="groff not installed")
def test_pages_have_no_roff_warnings(pages: dict[str, str], tmp_path: Path) -> None:
    for name, text in pages.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        done = subprocess.run(["groff", "-man", "-ww", "-z", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and not done.stderr, (name, done.stderr)


def test_the_package_build_generates_and_installs_the_three_pages() -> None:
    rules = (ROOT / "packaging/debian/rules").read_text()
    assert "tools/make-man debian/man" in rules
    for name in PAGES:
        assert f"debian/man/{name}" in rules


def test_readme_command_table_is_generated_from_the_click_tree() -> None:
    reference = subprocess.run([PYTHON, str(ROOT / "tools/clidoc.py")], capture_output=True,
                               text=True, env=script_env(), check=True).stdout
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert reference.strip() in readme, "README's command table is stale: paste " \
        "`python3 tools/clidoc.py` into its Commands section"
    for line in reference.splitlines()[2:]:
        assert not line.startswith(("| `pre-start", "| `wait-ready", "| `wait-free"))
    # an on/off pair shows both spellings and its default: check verifies unless --no-verify
    [check] = [line for line in reference.splitlines() if line.startswith("| `check ")]
    assert check.endswith("`--verify / --no-verify` (verify) |"), check

"""The Ansible role of contrib/ansible: it installs the package without its
dependencies' Recommends, and keeps to ansible-lint's rules that a run of it
found broken (ansible-lint itself is not installed here; these
are its rules, read from its documentation): a command task says when it
changes the host (no-changed-when), and a task name has its Jinja template
only at its end (name[template])."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "contrib/ansible/roles/infer_units/tasks"
COMMANDS = {"ansible.builtin.command", "ansible.builtin.shell", "command", "shell",
            "ansible.builtin.raw", "raw"}


def tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for task in items:
        found.append(task)
        for part in ("block", "rescue", "always"):
            found += tasks(task.get(part) or [])
    return found


def every_task() -> list[tuple[str, dict[str, Any]]]:
    return [(f.name, t) for f in sorted(TASKS.glob("*.yml"))
            for t in tasks(yaml.safe_load(f.read_text()))]


def test_every_command_says_when_it_changes_the_host() -> None:
    silent = [(f, t["name"]) for f, t in every_task()
              if COMMANDS & set(t) and not {"changed_when", "creates", "removes"} & set(t)]
    assert not silent, silent


def test_task_names_have_their_template_only_at_the_end() -> None:
    bad = [(f, t["name"]) for f, t in every_task()
           if "{{" in t.get("name", "") and not re.search(r"\{\{[^{}]*\}\}$", t["name"])
           or t.get("name", "").count("{{") > 1]
    assert not bad, bad


def test_the_package_is_installed_without_its_dependencies_recommends() -> None:
    """python3-jinja2 recommends python3-babel (Jinja's i18n, unused here):
    the role, like README's apt line, leaves Recommends out."""
    [install] = [t for _, t in every_task() if "ansible.builtin.apt" in t]
    assert install["ansible.builtin.apt"].get("install_recommends") is False, install
    readme = (ROOT / "README.md").read_text()
    assert "apt install --no-install-recommends ./dist/infer-units_" in readme

"""The command reference, read from the click command tree: the README's
command table (`python3 tools/clidoc.py`) and the man page
infer-units(1) (tools/make-man) are generated from it, so neither can miss a
command or an option.  Hidden commands (the unit hooks, helpers/commands.py HOOKS) are left
out: operators never type them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import click

# Run as tools/clidoc.py or imported by tools/make-man: the checkout root holds infer_units.
if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class OptionDoc:
    flags: str          # "--timeout DURATION"
    help: str
    default: str        # "" when none is shown


@dataclass(frozen=True)
class CommandDoc:
    name: str
    usage: str          # "drain [OPTIONS]"
    summary: str        # the docstring's first sentence
    help: str           # the whole docstring, paragraphs joined
    options: tuple[OptionDoc, ...]


def _default(ctx: click.Context, opt: click.Option) -> str:
    if isinstance(opt.show_default, str):
        return opt.show_default             # e.g. "the interpreter running infer-units"
    # click >= 8.3 marks "no default" with a sentinel object, older ones with None
    unset = type(opt.default).__name__ == "Sentinel"
    if unset or opt.is_flag or opt.default in (None, (), [], False) or opt.show_default is False:
        return ""
    value = opt.get_default(ctx, call=False)
    if callable(value):
        return ""
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _option(ctx: click.Context, opt: click.Option) -> OptionDoc:
    flags = ", ".join(opt.opts)
    default = _default(ctx, opt)
    if opt.is_flag and opt.secondary_opts:
        # An on/off pair ("--verify/--no-verify"): both spellings, and which
        # one is the default, as --help says it ("verify").
        flags += " / " + ", ".join(opt.secondary_opts)
        on = opt.opts if opt.get_default(ctx, call=False) else opt.secondary_opts
        default = on[0].lstrip("-")
    if not opt.is_flag:
        make_metavar: Callable[..., str] = opt.make_metavar      # its signature: see _needs_ctx
        flags += " " + (make_metavar(ctx) if _needs_ctx(opt) else make_metavar())
    text = " ".join((opt.help or "").split())
    return OptionDoc(flags, text, default)


def _needs_ctx(opt: click.Option) -> bool:
    """click 8.2 passes the context to make_metavar, 8.1 (bookworm) does not."""
    import inspect
    return "ctx" in inspect.signature(opt.make_metavar).parameters


def commands() -> list[CommandDoc]:
    from infer_units.helpers.cli.root import all_commands, main
    root = click.Context(main, info_name="infer-units")
    docs = []
    found = all_commands()
    for name in sorted(found):
        command = found[name]
        if command.hidden:
            continue
        ctx = click.Context(command, info_name=name, parent=root)
        pieces = " ".join(p for p in command.collect_usage_pieces(ctx) if p != "[OPTIONS]")
        text = " ".join((command.help or "").split())
        options = tuple(_option(ctx, p) for p in command.params
                        if isinstance(p, click.Option) and not p.hidden)
        docs.append(CommandDoc(name, f"{name} {pieces}".strip(), command.get_short_help_str(200),
                               text, options))
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")     # "[kill|wait|fail]" must not split the row


def markdown_table() -> str:
    """One row per command: usage, what it does, its options with defaults."""
    lines = ["| command | what it does | options (default) |", "| --- | --- | --- |"]
    for c in commands():
        opts = "; ".join(f"`{o.flags}`" + (f" ({o.default})" if o.default else "")
                         for o in c.options)
        lines.append("| " + " | ".join(_cell(t) for t in (f"`{c.usage}`", c.help, opts)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())

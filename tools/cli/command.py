"""How the `workshop` command line reads its arguments and shows its help.

Global options anywhere: click parses a group's options only before its subcommand, so
`workshop buckets export yard -o json` would tell the subcommand "No such option: -o".
`GlobalOptionsGroup`, the root's group, first moves every global option it declares
(with its value) from anywhere on the line to the front, as `kubectl` and `gh` accept
them; they are declared once, on the root, and its `--help` lists them. `--help` and
`--version` stay where they are: they belong to the command they follow. `--` ends the
options, as everywhere.

Each command's help ends with the global options' names, pointing to the root's help.

Plain switches: typer shows every flag with a `<bool>` type, as if it took a value
(`--dry-run <bool>`); `plain_switches` gives each flag an empty metavar, so help shows
`--dry-run`, `--include-revoked/--no-include-revoked` and `--help` as the switches they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer
import typer.main

# typer vendors its own click: its Context and Command are these, not the `click` package's.
from typer import _click
from typer.core import TyperGroup, TyperOption


def build(app: typer.Typer) -> _click.Command:
    """The click command of `app` (shell completion included), its flags plain switches."""
    root = typer.main.get_command(app)
    plain_switches(root)
    name_global_options(root)
    return root


class GlobalOptionsGroup(TyperGroup):
    """The root group: its (non-eager) options are accepted anywhere on the line."""

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoisted(ctx, self.params, args))


def global_options(params: Sequence[_click.Parameter]) -> list[TyperOption]:
    """The root's options that its callback takes: not the eager ones (`--help`,
    `--version`), nor shell completion's (which it never sees)."""
    return [
        param
        for param in params
        if isinstance(param, TyperOption) and param.expose_value and not param.is_eager
    ]


def hoisted(ctx: _click.Context, params: Sequence[_click.Parameter], args: list[str]) -> list[str]:
    """`args` with the options of `params` (and their values) moved to the front, in order."""
    takes_value = {
        name: not option.is_flag
        for option in global_options(params)
        for name in (*option.opts, *option.secondary_opts)
    }
    front: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            rest += args[index - 1 :]
            break
        name, joined, _ = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in takes_value:
            if takes_value[name] and not joined:
                if index == len(args):
                    if ctx.resilient_parsing:  # completing the line: nothing to refuse yet
                        rest.append(arg)
                        break
                    ctx.fail(f"Option '{name}' requires an argument.")
                front += [arg, args[index]]
                index += 1
            else:
                front.append(arg)
        elif not arg.startswith("--") and takes_value.get(arg[:2]):  # -ojson
            front.append(arg)
        else:
            rest.append(arg)
    return front + rest


def plain_switches(command: _click.Command, parent: _click.Context | None = None) -> None:
    """Every flag of `command` and of the commands below it shows without a type."""
    settings = command.context_settings if parent is None else {}
    # The help option is made for a context (its names come from the root's settings).
    ctx = _click.Context(command, parent=parent, **settings)
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        plain_switches(sub, ctx)


def name_global_options(root: _click.Command) -> None:
    """Every command below `root` ends its help with the global options it takes too."""
    names = ", ".join("/".join(option.opts) for option in global_options(root.params))
    note = f"Global options, before or after the command: {names} (`workshop --help`)."
    pending = list(getattr(root, "commands", {}).values())
    while pending:
        command = pending.pop()
        command.epilog = note
        pending += getattr(command, "commands", {}).values()

"""What ``--help`` shows next to each option: a metavar for a value, nothing for a flag.

typer (0.29) fills that column with the parameter's Python type — ``<str>``, ``<bool>``,
``<list[str]>`` — which tells a user how the CLI is written, not what to type. kubectl and
click show a metavar for an option that takes a value and nothing for a flag, and so does Joch:

* a flag (``--watch``, ``--help``, ``--controllers/--no-controllers``) shows nothing;
* an option with a declared ``metavar`` shows it (``yaml|json|name``, ``SECONDS``, ``DIR``);
* any other option shows its long name in capitals (``--namespace NAMESPACE``), as argparse does;
* an argument shows nothing more: the name column already says ``KIND`` or ``NAME``; the usage
  line writes a required one as ``KIND`` (typer's own is ``{KIND}``).

typer has no hook for the classes of the parameters it builds, so ``PlainTypes.get_params`` (mixed
into the root group and every command) gives each parameter the subclass below that changes
``display_type_rich`` only; parsing is untouched.
"""

from __future__ import annotations

import contextlib
import io
import re

from typer import _click
from typer._click import Context, HelpFormatter, Parameter  # typer >= 0.29 ships its own click
from typer.core import TyperArgument, TyperCommand, TyperOption


class PlainOption(TyperOption):
    def display_type_rich(self, ctx: Context) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        longest = max(self.opts, key=len)
        return longest.lstrip("-").replace("-", "_").upper()


class PlainArgument(TyperArgument):
    def display_type_rich(self, ctx: Context) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        # typer writes a required argument as {KIND}; click and kubectl write KIND.
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def plain(param: Parameter) -> Parameter:
    if type(param) is TyperOption:
        param.__class__ = PlainOption
    elif type(param) is TyperArgument:
        param.__class__ = PlainArgument
    return param


class PlainTypes:
    """Mixin for a click command: its help shows metavars, not Python types."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        params: list[Parameter] = super().get_params(ctx)  # type: ignore[misc]
        return [plain(p) for p in params]


class Command(PlainTypes, TyperCommand):
    """Every ``joch`` subcommand.

    typer's rich help lays options out as a table as wide as the terminal; where an option's name
    does not fit (``joch server --help`` at 80 columns showed ``--max-concurrent…`` twice, for two
    different options), or a word of a help text, it is cut with an ellipsis. Such a command's help
    is click's plain layout instead (``--name METAVAR`` with its help below when the name is long),
    which cuts nothing."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        rendered = io.StringIO()
        with contextlib.redirect_stdout(rendered):
            super().format_help(ctx, formatter)
        text = rendered.getvalue()
        names = [name for param in self.get_params(ctx) if isinstance(param, TyperOption)
                 for name in (*param.opts, *param.secondary_opts)]
        cut = "…" in text  # a word too long for its column (a URL in a help text, an option's name)
        if not cut and all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) for name in names):
            super().format_help(ctx, formatter)  # again, to the terminal: colours and all
            return
        _click.Command.format_help(self, ctx, formatter)

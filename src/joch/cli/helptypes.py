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

from typer._click import Context, Parameter  # typer >= 0.29 ships its own click
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
    """Every ``joch`` subcommand."""

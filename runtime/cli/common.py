"""What every `edge` command shares: the --config help, the error exit, the help formatter."""

from __future__ import annotations

import argparse
import sys

import runtime.bindings.kinds  # noqa: F401 - the binding kinds' tables every config read needs
from runtime.control.config import CONFIG_NAMES

# --config's default (None): the first of these in the current folder, as wrangler looks for its own
CONFIG_HELP = f"path to the config (default: the first of {', '.join(CONFIG_NAMES)} in this folder)"


def _fail(message: str) -> int:
    print(f"edge: error: {message}", file=sys.stderr)
    return 2


class _DefaultsHelp(argparse.HelpFormatter):
    """Help that shows each option's default, where it has one worth showing and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if action.nargs == 0 or default in (None, argparse.SUPPRESS) or "default" in text:
            return text  # a flag, nothing to show, or the help already says it
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)"


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every parser of the command tree formats its help with _DefaultsHelp."""
    parser.formatter_class = _DefaultsHelp
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)

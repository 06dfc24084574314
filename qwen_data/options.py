"""What the project's command lines share: `--help` that gives every option's default."""

from __future__ import annotations

import argparse
import re

# Help that already says what happens when the option is not given: "(default: ...)", "(none: ...)".
_SAYS_DEFAULT = re.compile(r"\bdefault\b|\bnone:", re.IGNORECASE)


def says_default(help: str) -> bool:
    return bool(_SAYS_DEFAULT.search(help))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option that takes a value shows "(default: X)" after its help, unless its help states the
    default in its own words, as it must when the default is None (what "not given" does). A flag is
    off unless given; a --X/--no-X pair shows whether it is on."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if isinstance(action, argparse.BooleanOptionalAction) and not says_default(help):
            return help + f" (default: {'on' if action.default else 'off'})"
        shown = (action.option_strings and action.nargs != 0 and not action.required
                 and action.default not in (None, argparse.SUPPRESS) and not says_default(help))
        return help + " (default: %(default)s)" if shown else help

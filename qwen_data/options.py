"""What the project's command lines share: `--help` that gives every option's default."""

from __future__ import annotations

import argparse
import math
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


# -- numbers bounded while parsing: argparse names the option, the message gives the range ---------
INT32_MAX = 2**31 - 1  # an .idx sequence length is int32: no sample or row can be longer


def _number_text(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def bounded(kind=int, minimum=None, maximum=None, above=None):
    """An argparse type: a finite `kind` within [minimum, maximum] (`above`: strictly greater). Its
    refusal is one line, "argument --X: ... the range is ...", before anything runs."""
    low = (f"above {_number_text(above)}" if above is not None else
           f"at least {_number_text(minimum)}" if minimum is not None else None)
    high = f"at most {_number_text(maximum)}" if maximum is not None else None
    wanted = " and ".join(part for part in (low, high) if part)
    noun = "a whole number" if kind is int else "a finite number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}" + (f" ({wanted})" if wanted else "")) from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}" + (f" ({wanted})" if wanted else ""))
        if ((minimum is not None and value < minimum) or (maximum is not None and value > maximum)
                or (above is not None and value <= above)):
            raise argparse.ArgumentTypeError(f"{text} is out of range: {noun} {wanted}")
        return value

    parse.__name__ = kind.__name__  # what argparse calls the type in "invalid int value"
    return parse

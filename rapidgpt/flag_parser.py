"""argparse, made to report a whole command line's problems at once, one line each.

Plain argparse stops at the first bad value and prints the whole usage (dozens of lines) before
it. `FlagParser` instead:

- keeps going past a value that does not convert (`--lr abc`) or is not among the choices: the
  flag is left at its default and the problem is recorded (`ParsedFlags.problems`);
- collects every unknown flag with a "did you mean --num-layers?" hint;
- formats every message as `rapidgpt: error: <flag>: <what is wrong>; <what to do>` and ends with
  one "see rapidgpt --help" line (`report_and_exit`).

Importing this module imports nothing heavy: flags are checked before MindSpore is loaded.
"""
import argparse
import difflib
import sys

from rapidgpt.errors import UserError

PROG = "rapidgpt"
HELP_HINT = f"{PROG}: see '{PROG} --help' for every flag"


class ArgumentError(UserError, ValueError):
    """Flags (or combinations) that cannot work: `problems` is the list of one-line messages, each
    `<flag>: <what is wrong>; <what to do>`."""

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class Problems:
    """Collects validation problems so that one run reports all of them."""

    def __init__(self):
        self.messages = []

    def require(self, condition, message):
        """Record `message` unless `condition` holds; returns whether it held (so dependent checks
        can be skipped)."""
        if not condition:
            self.messages.append(message)
        return bool(condition)

    def add(self, message):
        self.messages.append(message)

    def raise_if_any(self):
        if self.messages:
            raise ArgumentError(self.messages)


class _BadValue:
    """What a flag holds while parsing when its value did not convert or was not a choice."""

    def __init__(self, message):
        self.message = message


def _tolerant(action):
    """Make `action` record a bad value instead of stopping the parse: its type conversion and its
    choices are checked here, the problem kept in a `_BadValue`."""
    convert, choices = action.type, action.choices
    action.convert = convert
    flag = action.option_strings[0]
    if choices is not None and action.metavar is None:
        action.metavar = "{" + ",".join(map(str, choices)) + "}"      # --help still lists them
    action.choices = None

    def checked(text):
        try:
            value = convert(text) if convert is not None else text
        except (TypeError, ValueError):
            kind = {int: "an integer", float: "a number"}.get(convert, "a valid value")
            return _BadValue(f"{flag}: {text!r} is not {kind}; give e.g. {flag} "
                             f"{'8' if convert is int else '0.1' if convert is float else '...'}")
        if choices is not None and value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return _BadValue(f"{flag}: {text!r} is not one of the choices; {hint}choose one of "
                             f"{', '.join(map(str, choices))}")
        return value

    action.type = checked


def _usable_default(action):
    """The value a flag whose given value was bad falls back to, so the other checks still run: its
    default, converted when it is a string (defaults read from the environment); None when even
    that does not convert."""
    if action is None:
        return None
    default, convert = action.default, getattr(action, "convert", None)
    if isinstance(default, str) and convert is not None:
        try:
            return convert(default)
        except (TypeError, ValueError):
            return None
    return default


class ParsedFlags(argparse.Namespace):
    """The namespace `FlagParser.parse` returns; `problems` lists what could not be parsed."""


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser whose `parse` collects problems instead of exiting at the first one."""

    def __init__(self, **kwargs):
        kwargs.setdefault("prog", PROG)
        kwargs.setdefault("allow_abbrev", False)       # as Megatron: --num-layer is not --num-layers
        super().__init__(**kwargs)

    def error(self, message):
        """argparse's own errors (a flag without its value, ...): one line, exit status 2."""
        report_and_exit([_rephrase(message)])

    def option_names(self):
        """The flags --help lists (the hidden ones, Megatron's flags without an equivalent here, are
        never suggested for a misspelling)."""
        return [name for action in self._actions if action.help != argparse.SUPPRESS
                for name in action.option_strings if name.startswith("--")]

    def parse(self, argv, tolerate_unknown=False):
        """`(namespace, problems)`: every value that did not convert, every unknown flag (unless
        `tolerate_unknown`: a user script may add flags this parser does not know yet)."""
        for action in self._actions:
            if action.option_strings and (action.type is not None or action.choices is not None) \
                    and not hasattr(action, "convert"):
                _tolerant(action)
        args, extras = self.parse_known_args(list(argv), namespace=ParsedFlags())
        problems = []
        actions = {action.dest: action for action in self._actions}
        for name, value in vars(args).items():
            bad = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, _BadValue)]
            if bad:
                problems.append(bad[0].message)
                setattr(args, name, _usable_default(actions.get(name)))
        if not tolerate_unknown:
            problems += self.unknown_flag_problems(extras)
        return args, problems

    def unknown_flag_problems(self, extras):
        problems, known = [], self.option_names()
        for i, item in enumerate(extras):
            if item.startswith("-"):
                name = item.split("=", 1)[0]
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                hint = f"did you mean {close[0]}?" if close else "remove it, or check its spelling"
                problems.append(f"{name}: unknown flag; {hint}")
            elif i == 0 or not extras[i - 1].startswith("-"):
                problems.append(f"{item}: unexpected value (no flag takes it); remove it or put its flag before it")
        return problems


def _rephrase(message):
    """argparse's 'argument --lr: expected one argument' as '--lr: expected one argument; ...'."""
    if message.startswith("argument "):
        flag, _, what = message[len("argument "):].partition(": ")
        flag = flag.split("/")[0]
        if "expected" in what:
            return f"{flag}: {what} (a value must follow the flag); give it, or remove the flag"
        return f"{flag}: {what}"
    return message


def report_and_exit(problems, status=2):
    """Print each problem as `rapidgpt: error: ...`, then the help hint, and exit."""
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    print(HELP_HINT, file=sys.stderr)
    sys.exit(status)

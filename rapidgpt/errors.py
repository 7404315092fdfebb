"""The base of RapidGPT's errors about the user's input (a checkpoint, data file, hook, flag).

Each says what is wrong and what to do in its message; the `rapidgpt` command prints that message
as one line and exits with status 1, instead of a traceback through the engine. Each subclass also
derives from the builtin it refines (ValueError, RuntimeError, ...), so `except ValueError` keeps
working for library users."""


class UserError(Exception):
    """Something the user can fix; the message says what and how."""

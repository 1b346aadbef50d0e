"""How the command-line tools (train.main, train.export, train.analyze) end on a user's error.

An error the user can fix prints one short paragraph, "Error: <what is wrong and how to fix it>",
and exits with status 1, without a Python traceback (`--verbose` shows it). That covers bad flag
values and misspelt `--config.field` overrides (found while parsing the flags), and what the
tool raises as `UsageError`, `ValueError`, `TypeError` or `OSError` (missing, unreadable or
unwritable files). Other exceptions are bugs or failures of the environment and keep their
traceback.
"""

import sys
import traceback

from absl import app, flags

flags.DEFINE_bool("verbose", False, "Show the Python traceback of an error.")

USER_ERRORS = (app.UsageError, ValueError, TypeError, OSError)


def fail(message, exit_code=1):
    """Prints `Error: message` (one paragraph) to stderr and exits with `exit_code`."""
    text = " ".join(str(message).split())  # one paragraph, whatever the message's layout
    print(f"Error: {text}", file=sys.stderr)
    sys.exit(exit_code)


def _message(error):
    text = str(error).strip()
    if isinstance(error, (AttributeError, KeyError)):
        # ml_collections quotes its message, escapes included: 'field'\nDid you mean ...
        text = text.strip("'\"").replace("\\n", " ").replace("\\'", "'")
    return text or type(error).__name__


def _parse_flags(argv):
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        fail(f"{str(error).rstrip('.')}. Run with --helpshort to see the flags.")
    except (AttributeError, KeyError, *USER_ERRORS) as error:  # --config.<misspelt>=...
        if "--verbose" in argv:
            traceback.print_exc()
        fail(f"--config: {_message(error)}")


def run(main, argv=None):
    """`absl.app.run(main, argv)` that reports user errors as one paragraph (see the module
    doc); `argv` defaults to sys.argv."""

    def reporting_main(argv):
        try:
            return main(argv)
        except USER_ERRORS as error:
            if flags.FLAGS.verbose:
                traceback.print_exc()
            fail(_message(error))

    app.run(reporting_main, argv=argv, flags_parser=_parse_flags)

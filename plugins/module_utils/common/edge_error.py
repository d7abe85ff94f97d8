# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one error hierarchy of the code edgetune runs, on the controller and on the device.

EdgeError is an expected failure: a message per problem, each saying what is
wrong and what to do, and result keys a module passes to fail_json. BadInput is
the part of it that refuses input (a value, a file the code cannot handle);
it is also a ValueError, so code that validates with ``except ValueError``
keeps working. Every error class of the module utilities derives from one of
the two. Python 3.8+, stdlib only.
"""


class EdgeError(Exception):
    """Expected failure: ``errors`` (one message, or a list of them) and result keys for fail_json."""

    def __init__(self, errors, **details):
        self.errors = [errors] if isinstance(errors, str) else [str(e) for e in errors]
        super().__init__("; ".join(self.errors))
        self.details = details


class BadInput(EdgeError, ValueError):
    """Refused input: a value or a file the code cannot handle; the message says which and why."""


class BadType(BadInput, TypeError):
    """Refused input of the wrong type (a string where a list is asked, say); also a TypeError."""


def exit_module(module, name, work):
    """A module's last step: ``work()`` gives (result, diff); exit with the result, with the diff in diff
    mode, or fail in one line: an EdgeError with its errors and details, anything else named with the
    module's ``name`` (never a traceback)."""
    try:
        result, diff = work()
    except EdgeError as exc:
        module.fail_json(msg=str(exc), errors=exc.errors, **exc.details)
    except Exception as exc:  # never a traceback: report what went wrong in one line
        module.fail_json(msg="%s: unexpected %s: %s" % (name, type(exc).__name__, exc))
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)

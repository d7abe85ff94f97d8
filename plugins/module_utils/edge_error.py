# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one error type of the settings the boot program re-applies.

Raised by the code the modules and the boot program share (interrupts, DVFS,
PCIe TC/VC mappings, the RT budget, jetson_clocks) for an expected failure: a
message per problem, each saying what is wrong and what to do, and result keys
a module passes to fail_json. Python 3.8+, stdlib only.
"""


class EdgeError(Exception):
    """Expected failure: ``errors`` (one message, or a list of them) and result keys for fail_json."""

    def __init__(self, errors, **details):
        self.errors = [errors] if isinstance(errors, str) else [str(e) for e in errors]
        super().__init__("; ".join(self.errors))
        self.details = details

"""The device checks: what `edgetune verify` runs against devices, and molecule against the twins.

Each module holds the checks of one concern: pytest functions marked
``device``, which only read a device (testinfra's ``host``), and the helpers
molecule's own tests share with them. `edgetune verify` runs pytest on these
modules with edgetune.checks.plugin, whose fixtures give each device's
expectations from its plan ($EDGETUNE_VERIFY_PLAN, written by verify).
molecule/shared/tests imports the same functions, so pytest collects them
there too, with the twins' hand-written expectations: fixtures of the same
names in that conftest and those test modules take precedence over the
plugin's. One copy of the check code, shipped with the CLI.
"""
import os
from pathlib import Path

from edgetune import ansible_setup

# Set by `edgetune verify`: the expectations derived for each device.
VERIFY_PLAN = os.environ.get("EDGETUNE_VERIFY_PLAN")
# The modules of checks, in the order they run.
MODULES = ("bootargs", "cpu_cgroups", "power", "netqos", "pcie_qos", "runtime")


def paths():
    """The files of the check modules (what verify gives pytest)."""
    return [Path(__file__).resolve().parent / (name + ".py") for name in MODULES]


def inventory_file():
    """The inventory the checks run from (the one `edgetune verify` was given, else molecule's)."""
    if VERIFY_PLAN:
        return os.environ["EDGETUNE_VERIFY_INVENTORY"]
    return os.environ["MOLECULE_INVENTORY_FILE"]


def format_cpulist(cpus):
    """The kernel's compact CPU list ([0, 1, 2, 3, 6] -> '0-3,6'), by the collection's one formatter."""
    return ansible_setup.module_utils("common.edge_cpulist").format_cpulist(cpus)

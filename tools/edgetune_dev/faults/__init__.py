"""Faults: what an apply changes on a device, observed at the system call (writepoints), to cut it there.

`edgetune-dev faults trace` (writepoints.main) lists an apply's write points on a container twin.
"""


def add_parser(subparsers):
    """`edgetune-dev faults`: its subcommands are modules' own mains (cli.PASSED)."""
    faults = subparsers.add_parser("faults", help="an apply's write points, observed on a twin (fault campaign)")
    faults.edgetune_sub = faults.add_subparsers(dest="faults_command", required=True)

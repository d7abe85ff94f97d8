# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd slice names and the cgroups systemd gives them (Python 3.8+, stdlib only).

systemd nests a slice by the dashes of its name (systemd.slice(5)): ``ai-infer.slice`` lives in
``ai.slice``, so its cgroup is ``/ai.slice/ai-infer.slice``. Every module that finds a slice's
cgroup goes through these functions.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

# A unit name's characters (systemd.unit(5)); dashes separate the levels, none of them empty.
_SLICE = re.compile(r"^[A-Za-z0-9:_.\\]+(-[A-Za-z0-9:_.\\]+)*\.slice$")


def slice_chain(name):
    """The slice and the slices systemd nests it in, deepest first: ai-infer.slice -> [ai-infer.slice,
    ai.slice]; the root slice (-.slice) has none."""
    if name == "-.slice":
        return []
    if not _SLICE.match(name or ""):
        raise BadInput("%r is not a slice unit name (like ai-infer.slice)" % name)
    parts = name[:-len(".slice")].split("-")
    return ["-".join(parts[:i]) + ".slice" for i in range(len(parts), 0, -1)]


def slice_cgroup(name):
    """'ai-infer.slice' -> '/ai.slice/ai-infer.slice'; '-.slice' -> '/'. BadInput (a ValueError) for a
    name that is not a slice unit."""
    return "/" + "/".join(reversed(slice_chain(name)))

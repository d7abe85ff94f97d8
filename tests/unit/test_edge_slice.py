"""A slice's cgroup as systemd nests it (plugins/module_utils/common/edge_slice.py), the one rule every module uses."""
import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.common import edge_slice

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_rt

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_slice_checks
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_netqos_loader


@pytest.mark.parametrize("name, chain, cgroup", [
    ("ai-infer.slice", ["ai-infer.slice", "ai.slice"], "/ai.slice/ai-infer.slice"),
    ("edge-ai-infer.slice", ["edge-ai-infer.slice", "edge-ai.slice", "edge.slice"],
     "/edge.slice/edge-ai.slice/edge-ai-infer.slice"),
    ("system.slice", ["system.slice"], "/system.slice"),
    ("-.slice", [], "/"),
])
def test_a_slice_lives_in_the_slices_its_dashes_name(name, chain, cgroup):
    assert edge_slice.slice_chain(name) == chain
    assert edge_slice.slice_cgroup(name) == cgroup
    # The modules that need it, each in its own form, agree.
    assert edge_rt.slice_cgroup(name) == cgroup
    if name != "-.slice":
        assert edge_slice_checks.slice_dir(name) == cgroup.lstrip("/")
        assert edge_netqos_loader.slice_path(name) == cgroup.lstrip("/")


@pytest.mark.parametrize("name", ["ai--infer.slice", "ai-.slice", "ai infer.slice", "ai-infer.service", "", None])
def test_a_name_that_is_not_a_slice_is_refused(name):
    with pytest.raises(ValueError, match="is not a slice unit name"):
        edge_slice.slice_cgroup(name)
    with pytest.raises(edge_netqos_loader.NetQosError, match="is not a slice name systemd would nest"):
        edge_netqos_loader.slice_path(name)

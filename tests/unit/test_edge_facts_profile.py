"""The board matched to its profile on the controller, in edge_facts' own task (its action plugin):
the role's real profiles, an extra directory after them, an unknown board and CPU clusters other
than the profile's refused with one line each."""
from pathlib import Path

import pytest
from test_edge_intent import board

pytestmark = pytest.mark.controller

REPO = Path(__file__).resolve().parents[2]
PROFILES = str(REPO / "roles" / "edge_facts" / "files" / "board_profiles")


def test_the_real_profiles_match_the_boards():
    from ansible_collections.edgetune.fleet.plugins.action.edge_facts import load_profiles, profile_problem
    from ansible_collections.edgetune.fleet.plugins.filter.edge_board_profile import edge_board_profile
    profiles = load_profiles([PROFILES])
    for name in ("orin-nx", "agx-r35", "rock5b"):
        facts, expected = board(name)
        found = edge_board_profile(profiles, facts)
        assert found["name"] == expected["name"], name
        assert profile_problem(found, facts, name, strict=True) is None


def test_an_extra_directory_comes_after_the_role_s_profiles(tmp_path):
    from ansible_collections.edgetune.fleet.plugins.action.edge_facts import load_profiles
    (tmp_path / "robot.yml").write_text("name: robot-017\nmatch: [acme,robot]\nclusters: ['0-3']\n")
    (tmp_path / "notes.txt").write_text("not a profile\n")
    profiles = load_profiles([PROFILES, str(tmp_path)])
    assert profiles[-1]["name"] == "robot-017" and len(profiles) == len(load_profiles([PROFILES])) + 1


def test_an_unknown_board_and_other_clusters_are_refused_naming_them():
    from ansible_collections.edgetune.fleet.plugins.action.edge_facts import load_profiles, profile_problem
    from ansible_collections.edgetune.fleet.plugins.filter.edge_board_profile import edge_board_profile
    facts, _profile = board("orin-nx")
    unknown = dict(facts, model="ACME Robot", compatible=["acme,robot"])
    assert edge_board_profile(load_profiles([PROFILES]), unknown) is None
    message = profile_problem(None, unknown, "robot-1", strict=True)
    assert message.startswith('Unknown board: model "ACME Robot", compatible ["acme,robot"]. Add a board profile')
    profile = edge_board_profile(load_profiles([PROFILES]), facts)
    other = dict(facts, cpu=dict(facts["cpu"], clusters=[{"cpus": "0-7"}]))
    message = profile_problem(profile, other, "orin-1", strict=True)
    assert message == ("orin-1 is matched to profile %s (clusters %s) but its cpufreq policies show [\"0-7\"]: "
                       "fix the profile or set edge_facts_strict_topology=false."
                       % (profile["name"], str(profile["clusters"]).replace("'", '"')))
    assert profile_problem(profile, other, "orin-1", strict=False) is None

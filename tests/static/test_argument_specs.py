"""Every role's meta/argument_specs.yml matches its defaults/main.yml."""
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


@pytest.mark.controller
@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_match_defaults(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults), "options and defaults differ in %s" % role.name
    for name, value in defaults.items():
        assert options[name].get("default") == value, "%s: default of %s differs" % (role.name, name)
        assert options[name].get("description"), "%s: %s has no description" % (role.name, name)
    public = [name for name in defaults if not name.startswith(role.name + "_")]
    assert not public, "%s: public variables must start with %s_: %s" % (role.name, role.name, public)


@pytest.mark.controller
def test_every_role_has_argument_specs():
    for role in ROLES:
        assert (role / "meta" / "argument_specs.yml").exists(), role.name

"""Where the VM twin's image is cached: once per machine, not once per checkout."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import json; from edgetune_dev.vm import image, runner; "
         "print(json.dumps({'cache': str(image.CACHE), 'run': str(runner.RUN)}))")


def paths(**env):
    base = dict((k, v) for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "EDGETUNE_VM_CACHE"))
    # The harness (tools/, the working directory) and the CLI it uses (cli/), installed or not.
    base["PYTHONPATH"] = os.pathsep.join([str(REPO / "cli")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", PROBE], env=dict(base, **env), cwd=str(REPO / "tools"),
                         stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
    return json.loads(out)


def test_the_image_is_in_the_users_cache_and_the_running_vm_in_the_checkout(tmp_path):
    found = paths(XDG_CACHE_HOME=str(tmp_path), HOME=str(tmp_path / "home"))
    assert found == {"cache": str(tmp_path / "edgetune" / "vm"), "run": str(REPO / ".cache" / "vm" / "run")}


def test_without_xdg_the_image_is_under_home_and_the_variable_overrides_both(tmp_path):
    assert paths(HOME=str(tmp_path))["cache"] == str(tmp_path / ".cache" / "edgetune" / "vm")
    assert paths(HOME=str(tmp_path), EDGETUNE_VM_CACHE=str(tmp_path / "vm"))["cache"] == str(tmp_path / "vm")

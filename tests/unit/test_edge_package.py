"""The device package (plugins/module_utils/plan/edge_package.py): one manifest, every program's files once,
installed as role edge_package's action lays them out, and each program runs from that directory alone."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_audit

from ansible_collections.edgetune.fleet.plugins.module_utils.plan import edge_package, edge_plan

ROOT = Path(__file__).resolve().parents[2]


def install(directory):
    """The package's files under ``directory``, as the action hands them to edge_files."""
    installed = []
    for item in edge_package.files():
        dest = directory / item["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = (ROOT / item["src"]).read_bytes()
        dest.write_bytes(data)
        installed.append({"dest": str(dest), "data": data})
    return installed


def test_every_program_of_the_manifest_is_in_the_package_once():
    files = edge_package.files()
    sources = [f["src"] for f in files]
    assert len(set(sources)) == len(sources) and len({f["dest"] for f in files}) == len(files)
    for program in edge_package.DEVICE_PROGRAMS:
        assert {f["src"] for f in edge_package.program_files(program)} <= set(sources), program
    # the audit command at the top, beside the package layout that holds its module utility of the same name
    dests = {f["dest"] for f in files}
    assert {"edge_audit.py", "ansible_collections/edgetune/fleet/plugins/module_utils/device/edge_audit.py",
            "ansible_collections/edgetune/fleet/plugins/module_utils/device/edge_netqos_loader.py",
            "ansible_collections/edgetune/fleet/plugins/module_utils/device/edge_boot.py"} <= dests
    assert edge_package.sources() == sorted(sources)


def test_the_checks_name_each_file_by_its_path_in_the_package_and_hold_until_one_is_edited(tmp_path):
    directory = tmp_path / "package"
    checks = edge_package.checks(install(directory), str(directory) + "/")
    assert len({c["setting"] for c in checks}) == len(checks) == len(edge_package.files())
    assert "device package edge_audit.py" in {c["setting"] for c in checks}
    assert all(c["role"] == "edge_package" and c["kind"] == "file" for c in checks)
    results, _summary = edge_audit.audit(checks)
    assert {r["state"] for r in results} == {"ok"}
    (directory / "edge_audit.py").write_text("# edited on the device\n")
    drifted = [r["setting"] for r in edge_audit.audit(checks)[0] if r["state"] != "ok"]
    assert drifted == ["device package edge_audit.py"]


@pytest.mark.parametrize("path, refused", [
    ("/usr/local/lib/edgetune/package", False), ("/opt/edgetune", False), ("/usr/local/lib/edgetune", False),
    ("/usr/local/lib/edgetune/boot", True), ("/usr/local/lib/edgetune/netqos/x", True),
    ("/usr/local/lib/edgetune/audit/", True), ("/usr/local/lib/edgetune/bootstrap", False)])
def test_an_earlier_program_directory_is_refused_as_the_package_directory(path, refused):
    assert bool(edge_package.refused_directory(path)) is refused


def test_the_audit_command_and_the_boot_program_run_from_the_package_alone(tmp_path):
    """Nothing of the collection or of Ansible beside the installed files: the audit command evaluates a
    record, and the boot program's module starts (an empty state directory: nothing to re-apply)."""
    directory = tmp_path / "package"
    install(directory)
    env = {"PATH": os.environ["PATH"]}
    command = directory / "edge_audit.py"
    checks = edge_package.checks([{"dest": str(command), "data": command.read_bytes()}], str(directory))
    (tmp_path / "checks.json").write_text(json.dumps({"checks": checks}))
    done = subprocess.run([sys.executable, "-S", str(directory / "edge_audit.py"),
                           "--checks", str(tmp_path / "checks.json"), "--lease", str(tmp_path / "apply.lease")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          cwd=str(tmp_path), env=env, check=False)
    assert done.returncode == 0 and done.stdout.startswith("ok "), (done.stdout, done.stderr)
    state = tmp_path / "boot.d"
    state.mkdir()
    boot = subprocess.run([sys.executable, "-S", "-m", edge_plan.boot_part()["module"], "--state-dir", str(state)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          cwd=str(directory), env=env, check=False)
    assert boot.returncode == 0, boot.stderr


def test_the_flat_module_utilities_of_earlier_releases_are_removed_and_nothing_installed_is(tmp_path):
    from ansible_collections.edgetune.fleet.plugins.modules.edge_files import to_remove
    directory = tmp_path / "package"
    install(directory)
    flat = directory / "ansible_collections/edgetune/fleet/plugins/module_utils"
    for name in ("edge_boot.py", "edge_error.py", "edge_netqos_loader.py"):  # as an earlier release left them
        (flat / name).write_text("# earlier release\n")
    earlier = edge_package.earlier_files(str(directory))
    assert str(flat / "edge_audit.py") in earlier and str(flat / "edge_cpulist.py") in earlier
    files = [{"dest": str(directory / f["dest"])} for f in edge_package.files()]
    left = ("edge_boot.py", "edge_error.py", "edge_netqos_loader.py")
    assert to_remove(earlier, files) == sorted(str(flat / name) for name in left)

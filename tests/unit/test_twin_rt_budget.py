"""A twin's RT budget (Docker's --cpu-rt-runtime) comes out of what the engine's cgroup has left:
given while there is enough, not asked for (and said) when the other twins hold it, nothing on a
kernel without RT group scheduling on cgroup v1. The engine's cgroup is a fake tree."""
from edgetune_dev.twin import manager


def engine_tree(tmp_path, monkeypatch, engine, twins):
    parent = tmp_path / "cpu" / "docker"
    parent.mkdir(parents=True)
    (parent / "cpu.rt_runtime_us").write_text("%d\n" % engine)
    for index, budget in enumerate(twins):
        (parent / ("twin%d" % index)).mkdir()
        (parent / ("twin%d" % index) / "cpu.rt_runtime_us").write_text("%d\n" % budget)
    monkeypatch.setattr(manager, "DOCKER_CPU_CGROUPS", (str(tmp_path / "missing"), str(parent)))


def test_a_twin_gets_its_budget_while_the_engine_has_it(tmp_path, monkeypatch):
    engine_tree(tmp_path, monkeypatch, 900000, [50000] * 17)
    said = []
    assert manager.rt_runtime_options("t", said.append) == ["--cpu-rt-runtime", "50000"] and not said


def test_no_budget_is_asked_for_when_the_other_twins_hold_it(tmp_path, monkeypatch):
    engine_tree(tmp_path, monkeypatch, 900000, [50000] * 17 + [0, 10000])
    said = []
    assert manager.rt_runtime_options("t", said.append) == []
    assert said == ["twin t gets no RT budget: the engine's cgroup %s has 40000 us of RT time left (a twin takes "
                    "50000; dockerd needs --cpu-rt-runtime, which `edgetune-dev twin engine` passes)"
                    % (tmp_path / "cpu" / "docker")]


def test_an_engine_without_rt_time_gives_none(tmp_path, monkeypatch):
    engine_tree(tmp_path, monkeypatch, 0, [])
    assert manager.rt_runtime_options("t", lambda _line: None) == []


def test_nothing_without_rt_group_scheduling_on_cgroup_v1(tmp_path, monkeypatch):
    monkeypatch.setattr(manager, "DOCKER_CPU_CGROUPS", (str(tmp_path / "a"), str(tmp_path / "b")))
    said = []
    assert manager.rt_runtime_options("t", said.append) == [] and not said

"""The network bench's arithmetic (tools/edgetune_dev/bench_netqos.py): the per-stage summary with
its acceptance ratios, and the queue's decision by the rule: the lowest inter-token P99 with the
classifier among the candidates that keep 90% of the link for bulk, replacing today's default only
where its per-round P99 range lies wholly below the default's at every rate."""
import pytest

from edgetune_dev import bench_netqos as nq

pytestmark = pytest.mark.controller  # the harness, on the controller


def stages(p99_by_stage, goodput=19.0, rounds=3):
    """Measured stages of one candidate: every round's gaps put that stage's P99 at the given value."""
    measured = []
    for round_index in range(rounds):
        for name, p99 in p99_by_stage.items():
            value = p99[round_index] if isinstance(p99, list) else p99
            measured.append({"stage": name, "round": round_index + 1, "gaps_ms": [10.0] * 98 + [value, value],
                             "ttft_ms": [40.0], "goodput_mbit": 0.0 if name == "no bulk" else goodput})
    return measured


def test_the_summary_states_the_goals_against_the_no_bulk_stage():
    summed = nq.llm_summary(stages({"no bulk": 20.0, nq.LLM_STAGES[1]: 200.0, nq.LLM_STAGES[2]: 24.0}), 20.0)
    assert summed["with_vs_no_bulk_p99"] == pytest.approx(1.2) and summed["without_vs_no_bulk_p99"] == 10.0
    assert summed["goodput_share"] == pytest.approx(0.95)
    assert summed["met"] and summed["load_strong_enough"]
    weak = nq.llm_summary(stages({"no bulk": 20.0, nq.LLM_STAGES[1]: 30.0, nq.LLM_STAGES[2]: 30.0}), 20.0)
    assert not weak["load_strong_enough"] and not weak["met"]


def candidate(with_p99s, goodput=19.0):
    return nq.llm_summary(stages({"no bulk": 20.0, nq.LLM_STAGES[1]: 200.0, nq.LLM_STAGES[2]: with_p99s},
                                 goodput=goodput), 20.0)


def test_a_candidate_clearly_better_at_every_rate_replaces_the_default():
    per_rate = {"20mbit": {"today": candidate([60, 70, 65]), "fq": candidate([25, 28, 30])},
                "100mbit": {"today": candidate([40, 45, 50]), "fq": candidate([20, 22, 21])}}
    decision = nq.decide(per_rate)
    assert decision["best"] == "fq" and decision["replaces_default"]


def test_overlapping_rounds_keep_the_default_even_when_the_median_is_lower():
    per_rate = {"20mbit": {"today": candidate([30, 60, 40]), "fq": candidate([25, 35, 28])}}
    decision = nq.decide(per_rate)
    assert decision["best"] == "fq" and not decision["replaces_default"]


def test_a_candidate_that_starves_bulk_is_not_a_candidate():
    per_rate = {"20mbit": {"today": candidate([60, 70, 65]), "starver": candidate([12, 13, 12], goodput=15.0)}}
    decision = nq.decide(per_rate)
    assert decision["best"] == "today" and not decision["replaces_default"]


def test_sweep_candidates_parse_and_refuse_unknown_keys():
    config = nq.parse_sweep_candidate("x:leaf=fq_codel,gso=off,high_rate=50%", "20mbit")
    assert config == {"name": "x", "leaf": "fq_codel", "gso": False, "high_rate": "50%", "rate": "20mbit"}
    assert all(nq.parse_sweep_candidate(text, "20mbit") for text in nq.SWEEP_CANDIDATES)
    with pytest.raises(SystemExit):
        nq.parse_sweep_candidate("x:queue=fq_codel", "20mbit")


def test_the_llm_bench_loads_a_faster_link_with_more_flows():
    assert [nq.llm_flows(rate) for rate in ("10mbit", "20mbit", "100mbit", "1gbit")] == [4, 4, 16, 166]

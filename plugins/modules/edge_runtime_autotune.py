#!/usr/bin/python
# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module edge_runtime_autotune: measure the runtime's candidate settings on the device and record the best."""

DOCUMENTATION = r"""
---
module: edge_runtime_autotune
short_description: Measure llama-server's candidate settings on the device and record the best
description:
  - >-
    Starts the release's llama-server once per candidate setting and round on the runtime's CPUs
    (CPU affinity and the candidate's scheduling policy on every thread, as the unit would set
    them), each on a free port of 127.0.0.1 beside the service, which keeps serving. It streams
    greedy generations with the deploy gate's client and ranks the candidates by inter-token P99,
    TTFT P99 as tie-break (plugins/module_utils/bench/edge_autotune.py, on the code of
    C(edgetune bench llm --host)).
  - >-
    Synthetic noise (O(noise)) runs on the housekeeping CPUs only when asked; otherwise every
    candidate is measured under the device's own load. Candidates run in rounds, shuffled per
    round; O(timeout) bounds the whole measurement (the rounds stop there; a first round that
    cannot finish refuses). A candidate that cannot start (SCHED_FIFO refused) is left out with the
    reason.
  - >-
    O(state=measured) writes the measurements and the choice to C(/etc/edgetune/autotune.pending.json)
    and publishes them as the fact C(edge_autotune), which the plan applies (the runtime's policy,
    priority and threads) while the plan's inference CPUs and backend are those it was measured with.
    O(state=accepted), once the deploy of the choice has passed its gates, makes it the device's record
    (C(/etc/edgetune/autotune.json), which edge_facts reads); a deploy rolled back leaves the record as
    it was. O(state=absent) removes the record: the plan's defaults apply again.
  - Refuses with one message, before anything starts, where the plan gives the runtime no inference CPUs.
version_added: "0.3.0"
author:
  - edgetune contributors (!UNKNOWN)
options:
  state:
    description: C(measured), C(accepted) or C(absent), see the description.
    type: str
    choices: [measured, accepted, absent]
    default: measured
  server:
    description: The llama-server program to measure (the release's C(runtime/) entry).
    type: path
  model:
    description: The GGUF model it loads (the release's C(engine/) entry).
    type: path
  cpus:
    description: The CPUs the runtime runs on (a CPU list); empty when it runs unpinned (every online CPU).
    type: str
    default: ""
  planned_cpus:
    description: The plan's inference CPUs (a CPU list), which the record names; empty refuses.
    type: str
    default: ""
  backend:
    description: What llama-server computes on (C(cuda) offloads every layer).
    type: str
    choices: [cpu, cuda, rknn]
    default: cpu
  default:
    description: The plan's settings without autotune (C(policy), C(priority), C(threads)); the first candidate.
    type: dict
    default: {}
  candidates:
    description: The other candidates, C(NAME:key=value,...) with keys C(policy), C(priority), C(threads).
    type: list
    elements: str
    default: []
  noise:
    description: C(none) (the device's own load), C(cpu) or C(cpu+mem) on the housekeeping CPUs.
    type: str
    choices: [none, cpu, cpu+mem]
    default: none
  rounds:
    description: Rounds; every candidate runs once per round.
    type: int
    default: 2
  generations:
    description: Streamed generations per candidate, over all rounds.
    type: int
    default: 10
  max_tokens:
    description: Tokens per generation.
    type: int
    default: 32
  timeout:
    description: The time bound of the whole measurement, in seconds.
    type: int
    default: 600
  release:
    description: The release measured, written into the record.
    type: str
    default: ""
notes:
  - The service keeps serving the previous release while the candidates run; its idle threads share the CPUs.
attributes:
  check_mode:
    description: Nothing is started or written; RV(ignore:changed) is true for O(state=measured).
    support: full
  diff_mode:
    description: Not supported.
    support: none
  platform:
    description: Runs on the board (Linux, Python 3.8 or later), as root.
    support: full
    platforms: linux
"""

EXAMPLES = r"""
- name: Measure the candidates under synthetic CPU noise
  edgetune.fleet.edge_runtime_autotune:
    server: /opt/edgetune/current/runtime/bin/llama-server
    model: /opt/edgetune/current/engine/model.gguf
    cpus: "4-7"
    planned_cpus: "4-7"
    default: {policy: other, priority: 40, threads: "n"}
    candidates: ["fifo:policy=fifo,priority=40", "fewer:threads=n-1"]
    noise: cpu
    timeout: 300
"""

RETURN = r"""
record:
  description: >-
    The measurement written (C(measured_at), C(cpus), C(measured_on), C(noise), C(results) best first
    with their TTFT and inter-token P99, C(refused), C(choice)); with O(state=accepted) the device's
    record; null for O(state=absent) or in check mode.
  returned: always
  type: dict
choice:
  description: The chosen candidate (C(name), C(policy), C(priority), C(threads)); null when none was measured.
  returned: always
  type: dict
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_autotune  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="measured", choices=["measured", "accepted", "absent"]),
            server=dict(type="path"),
            model=dict(type="path"),
            cpus=dict(type="str", default=""),
            planned_cpus=dict(type="str", default=""),
            backend=dict(type="str", default="cpu", choices=["cpu", "cuda", "rknn"]),
            default=dict(type="dict", default={}),
            candidates=dict(type="list", elements="str", default=[]),
            noise=dict(type="str", default="none", choices=["none", "cpu", "cpu+mem"]),
            rounds=dict(type="int", default=2),
            generations=dict(type="int", default=10),
            max_tokens=dict(type="int", default=32, no_log=False),
            timeout=dict(type="int", default=600),
            release=dict(type="str", default=""),
        ),
        required_if=[("state", "measured", ["server", "model"])],
        supports_check_mode=True,
    )
    p = module.params
    if p["state"] == "accepted":
        if module.check_mode:
            module.exit_json(changed=os.path.exists(edge_autotune.PENDING), record=None, choice=None)
        accepted = edge_autotune.accept_pending()
        record = edge_autotune.read_record()
        module.exit_json(changed=accepted, record=record, choice=(record or {}).get("choice"))
    if p["state"] == "absent":
        found = edge_autotune.read_record() is not None
        if found and not module.check_mode:
            edge_autotune.remove_record()
        module.exit_json(changed=found, record=None, choice=None, ansible_facts={"edge_autotune": None})
    try:
        default = dict({"policy": "other", "priority": 40, "threads": "n"}, **p["default"])
        candidates = edge_autotune.parse_candidates(p["candidates"], default)
        planned = edge_autotune.cpus_of(p["planned_cpus"])
        if not planned:
            raise edge_autotune.AutotuneError(
                "autotune: there are no inference CPUs to tune: the plan gives the runtime none "
                "(edge_runtime_cpus, or the CPU isolation of role edge_cpu); nothing was measured")
        if module.check_mode:
            module.exit_json(changed=True, record=None, choice=None,
                             msg="check mode: %d candidates would be measured" % len(candidates))
        # Unpinned (the kernel refused the plan's CPUs): the CPUs this process, like the service, may run on.
        cpus = edge_autotune.cpus_of(p["cpus"]) or sorted(os.sched_getaffinity(0))
        record = edge_autotune.measure(p["server"], p["model"], cpus, candidates, backend=p["backend"],
                                       noise=p["noise"], rounds=p["rounds"], generations=p["generations"],
                                       max_tokens=p["max_tokens"], timeout_s=p["timeout"], planned=planned)
        record["release"] = p["release"]
        edge_autotune.write_record(record, path=edge_autotune.PENDING)
    except edge_autotune.AutotuneError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg="autotune: %s; the settings stay as they are" % exc)
    module.exit_json(changed=True, record=record, choice=record["choice"], ansible_facts={"edge_autotune": record})


if __name__ == "__main__":
    main()

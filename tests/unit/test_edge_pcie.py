"""PCIe Virtual Channel: config space parser, TC/VC planning, the edge_pcie_vc module and the boot-time re-apply.

Real images come from pciutils' test dumps (fixtures/pcie/README.md); the shapes
those dumps lack (a disabled VC1, MFVC + VC9) are built here from the register
layout (Linux include/uapi/linux/pci_regs.h, pciutils lib/header.h).  The decoding is cross-checked with
``lspci -vvv -F`` on the same images.
"""
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import edge_pcie_vc
import pytest
from conftest import copy_module_util
from conftest import run_boot_program as boot
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_boot
from ansible_collections.edgetune.fleet.plugins.module_utils.device import edge_pcie as pcie
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import EdgeError
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pcie"
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"


# --------------------------------------------------------------------------
# Images

def load_dump(name):
    """An lspci -xxxx style fixture -> (device line, bytes)."""
    lines = (FIXTURES / name).read_text().splitlines()
    data = bytearray()
    for line in lines[1:]:
        offset, values = line.split(":", 1)
        assert int(offset, 16) == len(data), (name, offset)
        data += bytes(int(value, 16) for value in values.split())
    return lines[0], bytes(data)


def to_lspci(device_line, data):
    rows = [device_line]
    for offset in range(0, len(data), 16):
        rows.append("%02x: %s" % (offset, " ".join("%02x" % b for b in data[offset:offset + 16])))
    return "\n".join(rows) + "\n"


def vc_regs(evcc, controls, statuses=None, cap1_extra=0):
    """Register values of a VC capability body, relative to its base."""
    regs = {0x04: ("<I", evcc | cap1_extra), 0x08: ("<I", 0x00000001)}
    for index, control in enumerate(controls):
        regs[0x10 + 12 * index] = ("<I", 0x00000001)
        regs[0x14 + 12 * index] = ("<I", control)
        if statuses and statuses[index]:
            regs[0x1A + 12 * index] = ("<H", statuses[index])
    return regs


def spec_image(ext, class_code=0x010802, port_type=0x0, multifunction=False, vendor=0x1b36, device=0x0010):
    """A PCIe function's config space built from the spec's layout.

    ``ext``: [(offset, capability id, {relative offset: (struct format, value)})],
    chained in the order given.
    """
    cfg = bytearray(4096)
    struct.pack_into("<HHHH", cfg, 0, vendor, device, 0x0406, 0x0010)
    struct.pack_into("<I", cfg, 0x08, class_code << 8)
    cfg[0x0E] = (0x01 if port_type == 0x4 else 0x00) | (0x80 if multifunction else 0)
    cfg[0x34] = 0x40
    struct.pack_into("<BBH", cfg, 0x40, 0x10, 0x00, 0x0002 | (port_type << 4))
    for number, (offset, cap_id, regs) in enumerate(ext):
        nxt = ext[number + 1][0] if number + 1 < len(ext) else 0
        struct.pack_into("<I", cfg, offset, cap_id | (1 << 16) | (nxt << 20))
        for rel, (fmt, value) in regs.items():
            struct.pack_into(fmt, cfg, offset + rel, value)
    return bytes(cfg)


def vc1_disabled(port_type):
    """VC0 with all TCs and a disabled VC1 (ID 1, pending) at 0x148, after AER at 0x100."""
    return spec_image([(0x100, 0x0001, {}),
                       (0x148, 0x0002, vc_regs(1, [0x800000FF, 0x01000000], [0, 0x0002]))],
                      class_code=0x060400 if port_type == 0x4 else 0x010802, port_type=port_type)


def mfvc_vc9():
    return spec_image([(0x100, 0x0001, {}),
                       (0x140, 0x0008, vc_regs(1, [0x800000FD, 0x81000002])),
                       (0x180, 0x0009, vc_regs(0, [0x800000FF]))],
                      multifunction=True)


REAL = {
    "ich10-root-port-00-1c.2.lspci": {
        "port": "Root Port", "ext": [(0x100, 0x0002), (0x180, 0x0005)],
        "vc": [("VC", 0x100, [(0, 0x01, True, False)])]},
    "ich10-hda-00-1b.0.lspci": {
        "port": "Root Complex Integrated Endpoint", "ext": [(0x100, 0x0002), (0x130, 0x0005)],
        "vc": [("VC", 0x100, [(0, 0x01, True, False), (1, 0x80, True, False)])]},
    "qca988x-0000-05-00.0.lspci": {
        "port": "Endpoint", "ext": [(0x100, 0x0001), (0x140, 0x0002), (0x160, 0x0003)],
        "vc": [("VC", 0x140, [(0, 0xFF, True, False)])]},
    "p2020-root-port-0000-04-00.0.lspci": {
        "port": "Root Port", "ext": [(0x100, 0x0001)], "vc": []},
}


def summary(parsed):
    return [(vc["type"], vc["offset"], [(r["id"], r["tc_map"], r["enabled"], r["negotiation_pending"])
                                        for r in vc["vcs"]])
            for vc in parsed["vc_capabilities"]]


# --------------------------------------------------------------------------
# Parser on real and spec-built images

@pytest.mark.parametrize("name", sorted(REAL))
def test_real_devices_decode(name):
    _line, data = load_dump(name)
    parsed = pcie.parse(data)
    expected = REAL[name]
    assert parsed["size"] == 4096 and parsed["problems"] == []
    assert parsed["pcie"]["port_type_name"] == expected["port"]
    assert [(c["offset"], c["id"]) for c in parsed["ext_capabilities"]] == expected["ext"]
    assert summary(parsed) == expected["vc"]


def test_ich10_hda_vc1_fields():
    parsed = pcie.parse(load_dump("ich10-hda-00-1b.0.lspci")[1])
    vc = parsed["vc_capabilities"][0]
    assert (vc["extended_vc_count"], vc["low_priority_extended_vc_count"], vc["port_arb_table_entry_bits"]) == (1, 0, 1)
    vc1 = vc["vcs"][1]
    assert (vc1["control_offset"], vc1["status_offset"], vc1["control_register"]) == (0x120, 0x126, 0x81000080)
    assert vc1["tcs"] == [7]
    assert parsed["header"]["vendor"] == 0x8086 and parsed["header"]["class"] == 0x040300


def test_spec_images_decode():
    parsed = pcie.parse(vc1_disabled(0x4))
    assert summary(parsed) == [("VC", 0x148, [(0, 0xFF, True, False), (1, 0x00, False, True)])]
    assert parsed["pcie"]["port_type_name"] == "Root Port" and parsed["header"]["header_type"] == 1
    parsed = pcie.parse(mfvc_vc9())
    assert summary(parsed) == [("MFVC", 0x140, [(0, 0xFD, True, False), (1, 0x02, True, False)]),
                               ("VC9", 0x180, [(0, 0xFF, True, False)])]
    assert parsed["header"]["multifunction"] is True


def test_256_byte_image_has_no_extended_space():
    data = load_dump("ich10-root-port-00-1c.2.lspci")[1][:256]
    parsed = pcie.parse(data)
    assert parsed["ext_capabilities"] == [] and parsed["vc_capabilities"] == []
    assert [c["id"] for c in parsed["capabilities"]] == [0x10, 0x05, 0x0D, 0x01]


@pytest.mark.parametrize("size, message", [
    (64, "truncated: 64 bytes.*read it as root"),
    (100, "truncated: 100 bytes"),
    (0, "truncated: 0 bytes"),
    (512, "512 bytes, not a configuration space image"),
    (4097, "4097 bytes"),
])
def test_wrong_sizes_are_refused_clearly(size, message):
    with pytest.raises(pcie.ConfigSpaceError, match=message):
        pcie.parse(bytes(size))


def test_not_bytes_is_refused():
    with pytest.raises(pcie.ConfigSpaceError, match="expected bytes"):
        pcie.parse("00 11 22")


def chain(*links):
    """An image whose extended headers are exactly ``links``: (offset, id, next)."""
    cfg = bytearray(spec_image([]))
    for offset, cap_id, nxt in links:
        struct.pack_into("<I", cfg, offset, cap_id | (1 << 16) | (nxt << 20))
    return bytes(cfg)


@pytest.mark.parametrize("links, found, problem", [
    ([(0x100, 0x0001, 0x100)], [0x100], "loops back to 0x100"),
    ([(0x100, 0x0001, 0x200), (0x200, 0x0003, 0x100)], [0x100, 0x200], "loops back to 0x100"),
    ([(0x100, 0x0001, 0x0C0)], [0x100], "points to 0x0c0, outside"),
    ([(0x100, 0x0001, 0xFFC), (0xFFC, 0x0002, 0)], [0x100], "VC capability at 0xffc runs past the end"),
    ([(0x100, 0x0002, 0x114)], [0x100], "overlaps the capability at 0x100"),
    ([(0x100, 0x0001, 0x200)], [0x100], "capability at 0x200 has an empty header"),
])
def test_extended_list_walk_is_guarded(links, found, problem):
    caps, problems = pcie.walk_ext_capabilities(chain(*links))
    assert [c["offset"] for c in caps] == found
    assert len(problems) == 1 and problem in problems[0]


def test_next_pointer_low_bits_are_ignored():
    caps, problems = pcie.walk_ext_capabilities(chain((0x100, 0x0001, 0x203), (0x200, 0x0003, 0)))
    assert [c["offset"] for c in caps] == [0x100, 0x200] and problems == []


def test_vc_running_past_the_end_is_a_problem_not_a_crash():
    cfg = bytearray(chain((0x100, 0x0001, 0xFF0), (0xFF0, 0x0002, 0)))
    struct.pack_into("<I", cfg, 0xFF4, 1)  # EVCC=1: resources up to 0xFF0+0x28
    parsed = pcie.parse(bytes(cfg))
    assert parsed["vc_capabilities"] == []
    assert parsed["problems"] == ["VC capability at 0xff0 runs past the end of config space"]
    with pytest.raises(pcie.ConfigSpaceError, match="runs past the end"):
        pcie.decode_vc(bytes(cfg), 0xFF0)


def test_unreadable_extended_space_is_an_empty_list():
    cfg = bytearray(spec_image([]))
    cfg[0x100:0x104] = b"\xff\xff\xff\xff"
    assert pcie.walk_ext_capabilities(bytes(cfg)) == ([], [])


def test_standard_capability_list_is_guarded():
    cfg = bytearray(spec_image([]))
    cfg[0x41] = 0x40  # PCIe capability points to itself
    caps, problems = pcie.walk_capabilities(bytes(cfg))
    assert [c["offset"] for c in caps] == [0x40] and problems == ["capability list loops back to 0x40"]
    cfg[0x41] = 0x10
    assert pcie.walk_capabilities(bytes(cfg))[1] == ["capability pointer 0x10 is outside 0x40-0xfe; list ends there"]


def images_with_random_chains():
    """Mostly-zero images with random capability headers and random words in the first 1 KiB."""
    header = st.builds(lambda cap_id, version, nxt: cap_id | (version << 16) | (nxt << 20),
                       st.sampled_from([0x0001, 0x0002, 0x0003, 0x0008, 0x0009, 0xFFFF]),
                       st.integers(0, 15), st.integers(0, 0xFFF))
    word = st.one_of(header, st.integers(0, 0xFFFFFFFF), st.integers(0, 7))
    return st.tuples(header, st.lists(st.tuples(st.integers(0x41, 0x3FF), word), max_size=40))


@settings(max_examples=400, deadline=None)
@given(images_with_random_chains())
def test_any_image_parses_without_crashing(case):
    first, words = case
    cfg = bytearray(4096)
    struct.pack_into("<I", cfg, 0x100, first)
    for index, value in words:
        struct.pack_into("<I", cfg, index * 4, value)
    parsed = pcie.parse(bytes(cfg))
    seen = [c["offset"] for c in parsed["ext_capabilities"]]
    assert len(seen) == len(set(seen))
    for vc in parsed["vc_capabilities"]:
        assert len(vc["vcs"]) == vc["extended_vc_count"] + 1
        assert vc["offset"] + 0x10 + 12 * len(vc["vcs"]) <= 4096


# --------------------------------------------------------------------------
# Cross-check with lspci on the same images

def lspci_vc(text):
    """lspci -vvv output -> ([(offset, name)], [(offset, version, lpevc, [(vc, enable, id, tc_map, pending)])])."""
    caps = [(int(m.group(1), 16), m.group(3)) for m in
            re.finditer(r"^\tCapabilities: \[([0-9a-f]{3}) v(\d+)\] (.*)$", text, re.M)
            if int(m.group(1), 16) >= 0x100]
    blocks = []
    for match in re.finditer(r"^\tCapabilities: \[([0-9a-f]{3}) v(\d+)\] Virtual Channel\n((?:\t\t.*\n)*)", text, re.M):
        body = match.group(3)
        lpevc = int(re.search(r"LPEVC=(\d+)", body).group(1))
        vcs = [(int(n), enable == "+", int(vc_id), int(tcvc, 16), pending == "+") for n, enable, vc_id, tcvc, pending in
               re.findall(r"VC(\d+):\tCaps:.*\n.*\n\t+Ctrl:\tEnable([+-]) ID=(\d) ArbSelect=\S+ TC/VC=([0-9a-f]{2})\n"
                          r"\t+Status:\tNegoPending([+-])", body)]
        blocks.append((int(match.group(1), 16), int(match.group(2)), lpevc, vcs))
    return caps, blocks


def lspci_images():
    images = [(name,) + load_dump(name) for name in sorted(REAL)]
    images.append(("spec VC1 disabled, root port", "00:00.0 PCI bridge: spec", vc1_disabled(0x4)))
    images.append(("spec VC1 disabled, endpoint", "01:00.0 Non-Volatile memory controller: spec", vc1_disabled(0)))
    images.append(("spec MFVC + VC9", "02:00.0 Non-Volatile memory controller: spec", mfvc_vc9()))
    return images


@pytest.mark.skipif(shutil.which("lspci") is None, reason="lspci (pciutils) is not installed")
@pytest.mark.parametrize("name, device_line, data", lspci_images(), ids=lambda v: v if isinstance(v, str) else "")
def test_decoding_matches_lspci(tmp_path, name, device_line, data):
    dump = tmp_path / "dump"
    dump.write_text(to_lspci(device_line, data))
    done = subprocess.run(["lspci", "-vvv", "-F", str(dump)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert done.returncode == 0, done.stderr
    lspci_caps, lspci_blocks = lspci_vc(done.stdout)
    parsed = pcie.parse(data)
    assert [c for c, _name in lspci_caps] == [c["offset"] for c in parsed["ext_capabilities"]]
    for offset, text in lspci_caps:
        cap_id = next(c["id"] for c in parsed["ext_capabilities"] if c["offset"] == offset)
        if cap_id == pcie.ECAP_MFVC:
            assert text.startswith("Multi-Function Virtual Channel")
        elif cap_id in (pcie.ECAP_VC, pcie.ECAP_VC9):
            assert text == "Virtual Channel"  # lspci decodes 0x0002 and 0x0009 alike
    ours = [(vc["offset"], vc["version"], vc["low_priority_extended_vc_count"],
             [(r["index"], r["enabled"], r["id"], r["tc_map"], r["negotiation_pending"]) for r in vc["vcs"]])
            for vc in parsed["vc_capabilities"] if vc["type"] != "MFVC"]
    assert ours == lspci_blocks
    assert sum(len(vcs) for *_rest, vcs in lspci_blocks) == sum(
        vc["extended_vc_count"] + 1 for vc in parsed["vc_capabilities"] if vc["type"] != "MFVC")


# --------------------------------------------------------------------------
# Planning

def twin_vc(ctrl0=0x800000FF, ctrl1=0x01000000, extra=()):
    controls = [ctrl0, ctrl1] + list(extra)
    data = spec_image([(0x148, 0x0002, vc_regs(len(controls) - 1, controls))])
    return pcie.decode_vc(data, 0x148)


def test_plan_is_the_hardware_recipe_for_tc1_on_vc1():
    writes = pcie.plan_mapping(twin_vc(), [1], 1)
    assert [(w["offset"], w["value"], w["mask"], w["new"]) for w in writes] == [
        (0x15C, 0x000000FC, 0x000000FE, 0x800000FD),   # remove TC1 from VC0, TC0 untouched
        (0x168, 0x81000002, 0x870000FF, 0x81000002),   # VC1: enable, ID 1, TC1 (HARDWARE 7.3)
    ]
    assert pcie.plan_mapping(pcie.decode_vc(apply(twin_vc(), writes), 0x148), [1], 1) == []


def apply(vc, writes):
    """The image a decoded VC capability came from, with ``writes`` applied."""
    cfg = bytearray(4096)
    struct.pack_into("<I", cfg, vc["offset"], vc["id"] | (1 << 16))
    struct.pack_into("<I", cfg, vc["offset"] + 4, vc["extended_vc_count"])
    regs = pcie.expected_after(vc, writes)
    for res in vc["vcs"]:
        struct.pack_into("<I", cfg, res["control_offset"], regs[res["control_offset"]])
        struct.pack_into("<H", cfg, res["status_offset"], res["status_register"])
    return bytes(cfg)


def test_remap_returns_dropped_tcs_to_vc0_first():
    vc = twin_vc(0x800000FD, 0x81000002)
    writes = pcie.plan_mapping(vc, [2, 3], 1)
    assert [(w["register"], w["new"]) for w in writes] == [
        ("VC1 Resource Control", 0x81000000),  # TC1 leaves VC1 ...
        ("VC0 Resource Control", 0x800000F3),  # ... back to VC0, which gives up TC2 and TC3
        ("VC1 Resource Control", 0x8100000C),
    ]


def test_tc_moves_off_another_extended_vc():
    vc = twin_vc(0x800000F9, 0x01000000, extra=[0x82000006])  # TC1, TC2 on VC ID 2
    writes = pcie.plan_mapping(vc, [1], 1)
    assert [(w["register"], w["new"]) for w in writes] == [
        ("VC2 Resource Control", 0x82000004), ("VC1 Resource Control", 0x81000002)]


def test_vc0_bits_outside_the_tc_map_are_kept():
    # Intel root ports use VC0 control bits 15:8 (TC High VC0 Map): a masked write keeps them.
    vc = twin_vc(0x800012FF)
    assert pcie.plan_mapping(vc, [3], 1)[0]["new"] == 0x800012F7


@pytest.mark.parametrize("tcs, vc_id, message", [
    ([0], 1, "TC0 is always mapped to VC0"),
    ([8], 1, "traffic class 8 does not exist"),
    ([], 1, "non-empty list"),
    (["1"], 1, "is not an integer"),
    ([1], 0, "vc_id 0 is not a VC ID of 1-7"),
    ([1], 8, "vc_id 8"),
    ([1], 2, r"no extended VC resource with VC ID 2 \(IDs present: 1\)"),
])
def test_bad_requests(tcs, vc_id, message):
    with pytest.raises(pcie.MappingError, match=message):
        pcie.plan_mapping(twin_vc(), tcs, vc_id)


def start_states():
    """Extended VCs with distinct IDs and a conflict-free TC assignment; TC0 on VC0."""
    @st.composite
    def build(draw):
        evcc = draw(st.integers(1, 3))
        ids = draw(st.lists(st.integers(1, 7), min_size=evcc, max_size=evcc, unique=True))
        owner = [draw(st.integers(0, evcc)) for _tc in range(1, 8)]
        maps = [1] + [0] * evcc
        for tc, vc in enumerate(owner, 1):
            maps[vc] |= 1 << tc
        controls = [0x80000000 | maps[0]]
        for n in range(1, evcc + 1):
            controls.append((0x80000000 if draw(st.booleans()) else 0) | (ids[n - 1] << 24) | maps[n])
        vc_id = draw(st.sampled_from(ids))
        tcs = draw(st.lists(st.integers(1, 7), min_size=1, max_size=7, unique=True))
        return controls, vc_id, tcs
    return build()


@settings(max_examples=300, deadline=None)
@given(start_states())
def test_plan_keeps_every_tc_on_at_most_one_vc_and_reaches_the_goal(case):
    controls, vc_id, tcs = case
    vc = twin_vc(controls[0], controls[1], controls[2:])
    writes = pcie.plan_mapping(vc, tcs, vc_id)
    regs = {res["control_offset"]: res["control_register"] for res in vc["vcs"]}
    for write in writes:
        regs[write["offset"]] = pcie.merge(regs[write["offset"]], write["value"], write["mask"])
        owners = {}
        for value in regs.values():
            for tc in range(8):
                if value & (1 << tc):
                    owners[tc] = owners.get(tc, 0) + 1
        assert all(count == 1 for count in owners.values()), (hex(write["offset"]), regs)
    final = pcie.decode_vc(apply(vc, writes), 0x148)
    target = pcie.resource_for_id(final, vc_id)
    assert target["tcs"] == sorted(tcs) and target["enabled"]
    assert not set(final["vcs"][0]["tcs"]) & set(tcs) and 0 in final["vcs"][0]["tcs"]
    assert set(range(8)) == {tc for res in final["vcs"] for tc in res["tcs"]}  # every TC still mapped
    assert pcie.plan_mapping(final, tcs, vc_id) == []


# --------------------------------------------------------------------------
# sysfs trees

def class_of(data):
    return struct.unpack_from("<I", data, 0x08)[0] >> 8


def add_device(root, parent_dir, bdf, data):
    directory = parent_dir / bdf
    directory.mkdir(parents=True)
    (directory / "config").write_bytes(data)
    (directory / "class").write_text("0x%06x\n" % class_of(data))
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(str(directory), str(links)), str(links / bdf))
    return directory


def link_tree(root, upstream, device, domain=1, with_other=True):
    """A host bridge with a root port (``upstream`` image) and the device below it."""
    bus = root / "sys/devices/platform/14100000.pcie" / ("pci%04x:00" % domain)
    rp = add_device(root, bus, "%04x:00:00.0" % domain, upstream)
    ep = add_device(root, rp, "%04x:01:00.0" % domain, device)
    if with_other:  # an unrelated device that sorts first, so the class match has to pick
        add_device(root, root / "sys/devices/platform/other/pci0000:00", "0000:00:00.0",
                   load_dump("ich10-root-port-00-1c.2.lspci")[1])
    return rp / "config", ep / "config"


@pytest.fixture
def twin_link(tmp_path):
    """Root port and NVMe endpoint with VC0 + a disabled VC1, as the twins power on."""
    return tmp_path, link_tree(tmp_path, vc1_disabled(0x4), vc1_disabled(0x0))


class LinkPartner:
    """Stands in for config writes: the write lands, then the link negotiates.

    VC Negotiation Pending of an extended VC clears when it is enabled and the
    other end has an enabled VC with the same VC ID, and is set otherwise.
    ``stuck``: config files whose Enable bits are read-only 0 (a port that
    never enables VC1).
    """

    def __init__(self, files, cap=0x148, stuck=()):
        self.files = [str(f) for f in files]
        self.cap = cap
        self.stuck = {str(f) for f in stuck}
        self.log = []
        self.real = pcie.write_register

    def __call__(self, path, offset, value):
        path = os.path.realpath(path)
        self.log.append((path, offset, value))
        if path in self.stuck:
            value &= ~pcie.RES_CTRL_ENABLE
        self.real(path, offset, value)
        self.negotiate()

    def vcs(self, path):
        data = Path(path).read_bytes()
        evcc = struct.unpack_from("<I", data, self.cap + 4)[0] & 7
        for n in range(1, evcc + 1):
            ctrl = struct.unpack_from("<I", data, self.cap + 0x14 + 12 * n)[0]
            yield self.cap + 0x1A + 12 * n, bool(ctrl >> 31), (ctrl >> 24) & 7

    def negotiate(self):
        ends = [list(self.vcs(f)) for f in self.files]
        for me, path in enumerate(self.files):
            ids = {vc_id for _end, on, vc_id in ends[1 - me] if on}
            with open(path, "r+b") as handle:
                for status_offset, on, vc_id in ends[me]:
                    handle.seek(status_offset)
                    old = struct.unpack("<H", handle.read(2))[0]
                    handle.seek(status_offset)
                    handle.write(struct.pack("<H", old & ~2 if on and vc_id in ids else old | 2))


@pytest.fixture
def partner(twin_link, monkeypatch):
    _root, (rp, ep) = twin_link
    fake = LinkPartner([rp, ep])
    monkeypatch.setattr(pcie, "write_register", fake)
    return fake


def snapshot(root):
    found = {}
    for directory, _dirs, names in os.walk(str(root)):
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                found[path] = (Path(path).read_bytes(), os.stat(path).st_mtime_ns)
    return found


def reg(path, offset, size=4):
    return struct.unpack_from("<I" if size == 4 else "<H", Path(path).read_bytes(), offset)[0]


def run_module(args, capsys, check=False, diff=False):
    args = dict(args)
    args["_ansible_check_mode"] = check
    args["_ansible_diff"] = diff
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            edge_pcie_vc.main()
    return json.loads(capsys.readouterr().out)


NVME_TC1 = {"device_class": "0x0108", "tcs": [1], "vc_id": 1}


# --------------------------------------------------------------------------
# The module on a link with an extended VC

def test_maps_both_ends_upstream_first_and_reads_back(twin_link, partner, capsys):
    root, (rp, ep) = twin_link
    before = snapshot(root)
    result = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    assert result["changed"] and result["supported"]
    assert (result["device"], result["upstream"]) == ("0001:01:00.0", "0001:00:00.0")
    # Upstream port first, each end: VC0 gives up TC1, then VC1 gets ID 1, TC1, Enable.
    assert [(Path(p).parent.name, offset) for p, offset, _v in partner.log] == [
        ("0001:00:00.0", 0x15C), ("0001:00:00.0", 0x168), ("0001:01:00.0", 0x15C), ("0001:01:00.0", 0x168)]
    for config in (rp, ep):
        assert (reg(config, 0x15C), reg(config, 0x168), reg(config, 0x16E, 2)) == (0x800000FD, 0x81000002, 0)
    # Only those registers (and the status the link changed) differ.
    after = snapshot(root)
    for path in (str(rp), str(ep)):
        old, new = before[path][0], after[path][0]
        assert [i for i in range(4096) if old[i] != new[i]] == [0x15C, 0x168, 0x16B, 0x16E]
    assert {p for p in before if before[p][0] != after[p][0]} == {str(rp), str(ep)}
    ends = result["ends"]
    assert [e["role"] for e in ends] == ["upstream", "device"]
    assert ends[0]["after"] == {"VC0 Resource Control": "0x800000fd", "VC1 Resource Control": "0x81000002",
                                "VC1 Resource Status": "0x0000"}
    assert ends[0]["before"]["VC1 Resource Status"] == "0x0002"
    assert ends[1]["writes"][1]["setpci"] == "setpci -s 0001:01:00.0 0x168.l=81000002:870000ff"
    assert ends[0]["negotiation_pending"] is False and ends[1]["negotiation_pending"] is False


def test_second_run_changes_nothing(twin_link, partner, capsys):
    root, _configs = twin_link
    run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    tuned = snapshot(root)
    partner.log.clear()
    result = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    assert result["changed"] is False and partner.log == []
    assert all(e["writes"] == [] for e in result["ends"])
    assert snapshot(root) == tuned


def test_check_mode_writes_nothing_and_plans_the_real_writes(twin_link, partner, capsys):
    root, _configs = twin_link
    before = snapshot(root)
    planned = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys, check=True, diff=True)
    assert snapshot(root) == before and partner.log == []
    assert planned["changed"] is True
    assert "0001:00:00.0 VC@0x148 VC1 Resource Control: 0x81000002" in planned["diff"]["after"]
    assert "0001:00:00.0 VC@0x148 VC1 Resource Control: 0x01000000" in planned["diff"]["before"]
    done = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    strip = [[{k: w[k] for k in ("offset", "value", "mask", "old", "new")} for w in e["writes"]]
             for e in planned["ends"]]
    assert strip == [[{k: w[k] for k in ("offset", "value", "mask", "old", "new")} for w in e["writes"]]
                     for e in done["ends"]]
    assert [e["after"]["VC1 Resource Control"] for e in planned["ends"]] == \
        [e["after"]["VC1 Resource Control"] for e in done["ends"]]
    again = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys, check=True)
    assert again["changed"] is False


def test_device_by_address_and_short_address(twin_link, partner, capsys):
    root, (rp, _ep) = twin_link
    result = run_module({"device": "0001:01:00.0", "tcs": [5, 6, 7], "vc_id": 1, "sysfs_root": str(root)}, capsys)
    assert result["tcs"] == [5, 6, 7] and reg(rp, 0x168) == 0x810000E0 and reg(rp, 0x15C) == 0x8000001F
    tree = twin_link[0] / "short"
    link_tree(tree, vc1_disabled(0x4), vc1_disabled(0), domain=0, with_other=False)
    monkey = LinkPartner(list((tree / "sys/devices/platform/14100000.pcie/pci0000:00").rglob("config")))
    pcie.write_register, real = monkey, pcie.write_register
    try:
        assert run_module({"device": "01:00.0", "tcs": [1], "sysfs_root": str(tree)}, capsys)["device"] == \
            "0000:01:00.0"
    finally:
        pcie.write_register = real


def test_negotiation_stuck_pending_is_an_error(twin_link, monkeypatch, capsys):
    root, (rp, ep) = twin_link
    fake = LinkPartner([rp, ep], stuck=[ep])  # the device never enables VC1
    monkeypatch.setattr(pcie, "write_register", fake)
    result = run_module(dict(NVME_TC1, sysfs_root=str(root), timeout=0.05), capsys)
    assert result["failed"] and result["changed"] is True
    assert "0001:01:00.0 (device) VC1 Resource Control at 0x168 reads 0x01000002, expected 0x81000002" in result["msg"]
    assert "VC1 negotiation is still pending on 0001:00:00.0 (upstream port) after 0.05 s" in result["msg"]
    assert "VC1 negotiation is still pending on 0001:01:00.0 (device)" in result["msg"]


def test_waits_for_negotiation_then_succeeds(twin_link, monkeypatch):
    root, (rp, ep) = twin_link
    monkeypatch.setattr(pcie, "write_register", LinkPartner([rp, ep], stuck=[ep, rp]))  # nobody negotiates
    calls = []

    def fake_sleep(seconds):
        calls.append(seconds)
        if len(calls) == 3:  # the link comes up during the third wait
            for config in (rp, ep):
                data = bytearray(Path(config).read_bytes())
                struct.pack_into("<I", data, 0x168, 0x81000002)
                struct.pack_into("<H", data, 0x16E, 0)
                Path(config).write_bytes(bytes(data))
    clock = iter(range(100)).__next__
    result, _ends = pcie.run(str(root), device_class="0x0108", tcs=[1], timeout=10,
                             sleep=fake_sleep, clock=lambda: clock() * 0.01)
    assert len(calls) == 3 and result["supported"]


def test_write_refused_by_the_kernel_names_the_register(twin_link, monkeypatch, capsys):
    root, _configs = twin_link

    def refuse(path, offset, value):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(pcie, "write_register", refuse)
    result = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    assert result["failed"] and result["changed"] is False
    assert result["msg"] == ("writing VC0 Resource Control of 0001:00:00.0 (upstream port) (0x15c) failed:"
                             " Operation not permitted")


def test_device_that_drops_off_the_bus_is_an_error(twin_link, monkeypatch, capsys):
    root, (rp, ep) = twin_link
    fake = LinkPartner([rp, ep])

    def write_then_vanish(path, offset, value):
        fake(path, offset, value)
        if os.path.realpath(path) == str(ep) and offset == 0x168:
            Path(ep).write_bytes(b"\xff" * 4096)  # config reads of a device that is gone
    monkeypatch.setattr(pcie, "write_register", write_then_vanish)
    result = run_module(dict(NVME_TC1, sysfs_root=str(root), timeout=0.05), capsys)
    assert result["failed"] and result["changed"] is True
    assert "0001:01:00.0 (device) no longer shows its VC capability at 0x148" in result["msg"]


def test_writer_never_creates_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        pcie.write_register(str(tmp_path / "config"), 0x15C, 1)
    assert not (tmp_path / "config").exists()
    with pytest.raises(ValueError, match="unaligned"):
        pcie.write_register(str(tmp_path / "config"), 0x15E, 1)


# --------------------------------------------------------------------------
# Links without an extended VC, and bad input: nothing is written

def test_real_link_without_vc_upstream_is_unsupported(tmp_path, capsys):
    # The P2020 root port has no VC capability; the QCA988x below it has VC0 only.
    link_tree(tmp_path, load_dump("p2020-root-port-0000-04-00.0.lspci")[1],
              load_dump("qca988x-0000-05-00.0.lspci")[1])
    before = snapshot(tmp_path)
    result = run_module({"device_class": "0x0280", "tcs": [1], "sysfs_root": str(tmp_path)}, capsys)
    assert result["supported"] is False and result["changed"] is False
    assert result["reason"] == (
        "0001:00:00.0 (upstream port) has no Virtual Channel capability (VC0 only); "
        "0001:01:00.0 (device) has only VC0: its VC capability at 0x140 reports Extended VC Count 0")
    assert snapshot(tmp_path) == before
    failed = run_module({"device_class": "0x0280", "tcs": [1], "fail_unsupported": True,
                         "sysfs_root": str(tmp_path)}, capsys)
    assert failed["failed"] and failed["msg"].startswith("no extended virtual channel to map TCs 1 to: 0001:00:00.0")
    assert snapshot(tmp_path) == before


def test_root_complex_integrated_endpoint_is_unsupported(tmp_path, capsys):
    # The ICH10 HD Audio has VC1, but sits on the root bus: no link partner.
    add_device(tmp_path, tmp_path / "sys/devices/pci0000:00", "0000:00:1b.0", load_dump("ich10-hda-00-1b.0.lspci")[1])
    before = snapshot(tmp_path)
    result = run_module({"device": "0000:00:1b.0", "tcs": [7], "sysfs_root": str(tmp_path)}, capsys)
    assert result["supported"] is False and "is on a root bus" in result["reason"]
    assert snapshot(tmp_path) == before


def test_mfvc_device_is_unsupported(tmp_path, capsys):
    link_tree(tmp_path, vc1_disabled(0x4), mfvc_vc9())
    result = run_module(dict(NVME_TC1, sysfs_root=str(tmp_path)), capsys)
    assert result["supported"] is False
    assert result["reason"] == ("0001:01:00.0 (device) has only MFVC and VC9 (multi-function virtual channels),"
                                " which this module does not program")


def test_no_device_of_the_class_is_unsupported(twin_link, capsys):
    root, _configs = twin_link
    result = run_module({"device_class": "0x0300", "tcs": [1], "sysfs_root": str(root)}, capsys)
    assert result == dict(result, changed=False, supported=False, reason="no PCI device of class 0x0300 on this host")


@pytest.mark.parametrize("args, message", [
    ({"device": "0001:02:00.0", "tcs": [1]},
     "PCI device 0001:02:00.0 not found under .*; present: 0000:00:00.0 0001:00:00.0 0001:01:00.0"),
    ({"device": "01:00", "tcs": [1]}, "'01:00' is not a PCI address like 0000:01:00.0"),
    ({"device_class": "nvme", "tcs": [1]}, "device_class 'nvme' is not a PCI class"),
    ({"device_class": "0x0108", "tcs": [0]}, "TC0 cannot be moved: TC0 is always mapped to VC0"),
    ({"device_class": "0x0108", "tcs": [1, 9]}, "traffic class 9 does not exist"),
    ({"device_class": "0x0108", "tcs": [1], "vc_id": 3},
     r"0001:00:00.0 \(upstream port\) has no extended VC with VC ID 3 \(its VC resources 1-1 carry VC IDs 1\); "
     r"0001:01:00.0 \(device\) has no extended VC with VC ID 3 .*; both ends of the link need the same VC ID"),
    ({"device_class": "0x0108", "tcs": [1], "vc_id": 9}, "vc_id 9 is not a VC ID of 1-7"),
    ({"device_class": "0x0108", "tcs": [1], "timeout": 0}, "timeout must be a positive number"),
    ({"device": "0001:01:00.0", "device_class": "0x0108", "tcs": [1]}, "mutually exclusive"),
    ({"tcs": [1]}, "one of the following is required: device, device_class"),
])
def test_bad_input_fails_with_one_message_and_writes_nothing(twin_link, partner, capsys, args, message):
    root, _configs = twin_link
    before = snapshot(root)
    result = run_module(dict(args, sysfs_root=str(root)), capsys)
    assert result["failed"] and re.search(message, result["msg"]), result["msg"]
    assert snapshot(root) == before and partner.log == []


def test_vc_id_present_on_one_end_only_is_an_error(tmp_path, capsys):
    other = spec_image([(0x100, 0x0001, {}), (0x148, 0x0002, vc_regs(1, [0x800000FF, 0x02000000]))])
    link_tree(tmp_path, vc1_disabled(0x4), other)
    before = snapshot(tmp_path)
    result = run_module(dict(NVME_TC1, sysfs_root=str(tmp_path)), capsys)
    assert result["msg"] == ("0001:01:00.0 (device) has no extended VC with VC ID 1 (its VC resources 1-1 carry"
                             " VC IDs 2); both ends of the link need the same VC ID")
    assert snapshot(tmp_path) == before


def test_truncated_config_read_is_an_error_with_the_fix(twin_link, capsys):
    root, (_rp, ep) = twin_link
    Path(ep).write_bytes(Path(ep).read_bytes()[:64])
    result = run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    assert result["failed"] and "is truncated: 64 bytes" in result["msg"] and "read it as root" in result["msg"]


def test_documentation_matches_argument_spec(monkeypatch):
    captured = {}

    class Stop(Exception):
        pass

    def fake_module(**kwargs):
        captured.update(kwargs)
        raise Stop()

    monkeypatch.setattr(edge_pcie_vc, "AnsibleModule", fake_module)
    with pytest.raises(Stop):
        edge_pcie_vc.main()
    doc = yaml.safe_load(edge_pcie_vc.DOCUMENTATION)
    yaml.safe_load(edge_pcie_vc.EXAMPLES)
    yaml.safe_load(edge_pcie_vc.RETURN)
    spec = captured["argument_spec"]
    assert set(doc["options"]) == set(spec)
    for name, option in spec.items():
        documented = doc["options"][name]
        assert documented["type"] == option.get("type", "str"), name
        assert documented.get("default") == option.get("default"), name
        assert documented.get("required", False) == option.get("required", False), name
        assert documented.get("elements") == option.get("elements"), name
    assert captured["supports_check_mode"] is True
    assert doc["attributes"]["check_mode"]["support"] == "full"


# --------------------------------------------------------------------------
# Boot-time re-apply: the settings in edgetune's state format, run by edge_boot.apply_dir

def power_on(configs):
    """What a reboot does to the link: both ends back to VC0 with all TCs, VC1 disabled."""
    for config, port_type in zip(configs, (0x4, 0x0)):
        Path(config).write_bytes(vc1_disabled(port_type))


def state_dir(tmp_path, settings):
    """The boot program's state directory with the pcie_vc state file of ``settings``."""
    directory = tmp_path / "boot.d"
    directory.mkdir(exist_ok=True)
    path = edge_boot.state_path("pcie_vc", str(directory))
    Path(path).write_text(edge_boot.document("pcie_vc", settings, "edge_pcie_qos"))
    return directory


MAPPED = [
    "edgetune-boot: pcie_vc: 0001:00:00.0 VC0 Resource Control 0x15c: 0x800000ff -> 0x800000fd",
    "edgetune-boot: pcie_vc: 0001:00:00.0 VC1 Resource Control 0x168: 0x01000000 -> 0x81000002",
    "edgetune-boot: pcie_vc: 0001:01:00.0 VC0 Resource Control 0x15c: 0x800000ff -> 0x800000fd",
    "edgetune-boot: pcie_vc: 0001:01:00.0 VC1 Resource Control 0x168: 0x01000000 -> 0x81000002",
]


def test_boot_reapplies_the_mappings_after_reboot(twin_link, partner, capsys):
    root, (rp, ep) = twin_link
    directory = state_dir(root, pcie.boot_settings([NVME_TC1], 0.5, False))
    assert run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)["changed"]
    tuned = [Path(c).read_bytes() for c in (rp, ep)]
    power_on((rp, ep))
    assert boot(directory, root) == (0, MAPPED, [])
    # The registers and the negotiated status are exactly what the module left before the reboot.
    assert [Path(c).read_bytes() for c in (rp, ep)] == tuned
    for config in (rp, ep):
        assert (reg(config, 0x15C), reg(config, 0x168), reg(config, 0x16E, 2)) == (0x800000FD, 0x81000002, 0)
    partner.log.clear()
    assert boot(directory, root) == (0, [], [])  # mapped already: nothing written, nothing said
    assert partner.log == []


def test_boot_reports_each_failing_mapping_and_applies_the_rest(twin_link, partner):
    root, (rp, ep) = twin_link
    directory = state_dir(root, {"mappings": [
        {"device": "0009:01:00.0", "tcs": [1]},
        {"device_class": "0x0108", "tcs": [0]},
        {"device_class": "0x0108", "tcs": [1], "colour": "red"},
        "not a mapping",
        {"device_class": "0x0108", "tcs": [2], "vc_id": 1},
        {"device_class": "0x0280", "tcs": [1], "fail_unsupported": True},
        {"device_class": "0x0108", "tcs": [2], "timeout": "soon"},
    ]})
    status, out, err = boot(directory, root)
    assert status == 1
    assert err == [
        "edgetune-boot: pcie_vc: error: mapping 1 (0009:01:00.0): PCI device 0009:01:00.0 not found under %s; "
        "present: 0000:00:00.0 0001:00:00.0 0001:01:00.0" % pcie.devices_dir(str(root)),
        "edgetune-boot: pcie_vc: error: mapping 2 (class 0x0108): TC0 cannot be moved: TC0 is always mapped to VC0",
        "edgetune-boot: pcie_vc: error: mapping 3 (class 0x0108): unknown keys colour "
        "(a mapping has device, device_class, tcs, vc_id, timeout, fail_unsupported)",
        "edgetune-boot: pcie_vc: error: mapping 4: 'not a mapping' is not a mapping "
        "(a dict of device, device_class, tcs, vc_id, timeout, fail_unsupported)",
        "edgetune-boot: pcie_vc: error: mapping 6 (class 0x0280): no extended virtual channel to map TCs 1 to: "
        "no PCI device of class 0x0280 on this host",
        "edgetune-boot: pcie_vc: error: mapping 7 (class 0x0108): timeout must be a positive number of seconds, "
        "got 'soon'",
    ]
    # Mapping 5 was applied all the same: TC2 on VC ID 1 on both ends.
    assert out == [line.replace("0x800000fd", "0x800000fb").replace("0x81000002", "0x81000004") for line in MAPPED]
    assert [reg(c, 0x168) for c in (rp, ep)] == [0x81000004, 0x81000004]


def test_boot_leaves_a_link_without_extended_vc_as_it_is(tmp_path):
    # The P2020 root port has no VC capability; the QCA988x below it has VC0 only.
    link_tree(tmp_path, load_dump("p2020-root-port-0000-04-00.0.lspci")[1],
              load_dump("qca988x-0000-05-00.0.lspci")[1])
    directory = state_dir(tmp_path, pcie.boot_settings([{"device_class": "0x0280", "tcs": [1]}]))
    before = snapshot(tmp_path / "sys")
    status, out, err = boot(directory, tmp_path)
    assert (status, err) == (0, [])
    assert out == ["edgetune-boot: pcie_vc: mapping 1 (class 0x0280): not supported, left as it is: "
                   "0001:00:00.0 (upstream port) has no Virtual Channel capability (VC0 only); 0001:01:00.0 "
                   "(device) has only VC0: its VC capability at 0x140 reports Extended VC Count 0"]
    assert snapshot(tmp_path / "sys") == before
    directory = state_dir(tmp_path, pcie.boot_settings([{"device_class": "0x0280", "tcs": [1]}], 1.0, True))
    status, out, err = boot(directory, tmp_path)
    assert (status, out) == (1, [])
    assert err == ["edgetune-boot: pcie_vc: error: mapping 1 (class 0x0280): no extended virtual channel to map "
                   "TCs 1 to: 0001:00:00.0 (upstream port) has no Virtual Channel capability (VC0 only); "
                   "0001:01:00.0 (device) has only VC0: its VC capability at 0x140 reports Extended VC Count 0"]
    assert snapshot(tmp_path / "sys") == before


def test_boot_reports_the_writes_made_before_a_link_failed(twin_link, monkeypatch):
    root, (rp, ep) = twin_link
    monkeypatch.setattr(pcie, "write_register", LinkPartner([rp, ep], stuck=[ep]))  # the device never enables VC1
    directory = state_dir(root, pcie.boot_settings([NVME_TC1], 0.05))
    status, out, err = boot(directory, root)
    assert status == 1
    assert out == MAPPED  # the writes made, each with the value written ...
    assert len(err) == 1 and err[0].startswith("edgetune-boot: pcie_vc: error: mapping 1 (class 0x0108): ")
    # ... and the one that did not stick, read back.
    assert "0001:01:00.0 (device) VC1 Resource Control at 0x168 reads 0x01000002, expected 0x81000002" in err[0]
    assert "VC1 negotiation is still pending on 0001:01:00.0 (device) after 0.05 s" in err[0]
    assert reg(rp, 0x168) == 0x81000002 and reg(ep, 0x168) == 0x01000002


@pytest.mark.parametrize("settings, message", [
    ({}, 'pcie_vc settings must be {"mappings": [...]}, got {}: run the role edge_pcie_qos again'),
    ({"mappings": {"device": "0001:01:00.0"}}, 'pcie_vc settings must be {"mappings": [...]}'),
    ({"mappings": [], "timeout": 1}, "pcie_vc settings have unknown keys timeout (only mappings)"),
])
def test_boot_apply_refuses_malformed_settings(twin_link, partner, settings, message):
    root, _configs = twin_link
    before = snapshot(root)
    with pytest.raises(EdgeError) as info:
        pcie.boot_apply(settings, str(root))
    assert str(info.value).startswith(message)
    directory = state_dir(root, settings)
    status, out, err = boot(directory, root)
    assert (status, out) == (1, [])
    assert err == ["edgetune-boot: pcie_vc: error: %s" % info.value]
    assert partner.log == [] and {p: v for p, v in snapshot(root).items() if "boot.d" not in p} == before


@pytest.mark.parametrize("content, message", [
    ("{", "is not JSON"),
    (json.dumps({"format": 1, "generated_by": "edge_pcie_qos", "mappings": [NVME_TC1]}),  # the old format
     "is not an edgetune boot-time state of format 1"),
    (json.dumps([1, 2]), "is not an edgetune boot-time state of format 1"),
])
def test_boot_rejects_a_bad_state_file(twin_link, partner, content, message):
    root, _configs = twin_link
    directory = root / "boot.d"
    directory.mkdir()
    (directory / "pcie-vc.json").write_text(content)
    status, out, err = boot(directory, root)
    assert (status, out, len(err)) == (1, [], 1)
    assert err[0].startswith("edgetune-boot: error: state file %s " % (directory / "pcie-vc.json")), err
    assert message in err[0] and partner.log == []


def _device_python():
    """The device's Python (3.8, without Ansible), or this one."""
    return PY38 if os.path.exists(PY38) else sys.executable


def test_boot_program_runs_from_the_installed_layout_without_ansible(tmp_path):
    root = tmp_path / "root"
    rp, ep = link_tree(root, vc1_disabled(0x4), vc1_disabled(0))
    for config in (rp, ep):  # the link partner is not simulated in a subprocess: negotiation done
        data = bytearray(Path(config).read_bytes())
        struct.pack_into("<H", data, 0x16E, 0)
        Path(config).write_bytes(bytes(data))
    install = tmp_path / "usr/local/lib/edgetune"
    utils = install / "ansible_collections/edgetune/fleet/plugins/module_utils"
    utils.mkdir(parents=True)
    # Only what edgetune-boot needs to re-apply this kind (the boot program's files are these and more).
    needed = ("edge_boot", "edge_error", "edge_fileio", "edge_pcie")
    assert set(needed) <= set(boot_program_names())
    for name in needed:
        copy_module_util(name, utils)
    directory = state_dir(tmp_path, pcie.boot_settings([NVME_TC1], 0.5))
    command = [_device_python(), "-m", "ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_boot",
               "--state-dir", str(directory), "--root", str(root)]
    done = subprocess.run(command, cwd=str(install), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, PYTHONPATH=""), check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == MAPPED
    assert [reg(c, 0x168) for c in (rp, ep)] == [0x81000002, 0x81000002]
    again = subprocess.run(command, cwd=str(install), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, env=dict(os.environ, PYTHONPATH=""), check=False)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


# --------------------------------------------------------------------------
# The role's mappings as boot-time settings

def test_boot_settings_give_each_mapping_the_role_settings():
    settings = pcie.boot_settings([
        {"device_class": "0x0108", "tcs": [3, 1, 3]},
        {"device": "01:00.0", "device_class": "", "tcs": ["5", 6], "vc_id": "2"},
        {"device": None, "device_class": "0x0280", "tcs": [7], "vc_id": 1},
    ], "0.5", "yes")
    assert settings == {"mappings": [
        {"device_class": "0x0108", "tcs": [1, 3], "vc_id": 1, "timeout": 0.5, "fail_unsupported": True},
        {"device": "0000:01:00.0", "tcs": [5, 6], "vc_id": 2, "timeout": 0.5, "fail_unsupported": True},
        {"device_class": "0x0280", "tcs": [7], "vc_id": 1, "timeout": 0.5, "fail_unsupported": True},
    ]}
    assert pcie.boot_settings([], 1.0, False) == {"mappings": []}
    # What boot_settings gives, boot_apply takes: every mapping passes the same check.
    assert [pcie.check_mapping(m) for m in settings["mappings"]] == settings["mappings"]
    assert json.loads(json.dumps(settings)) == settings


def test_boot_settings_name_every_bad_mapping():
    with pytest.raises(EdgeError) as info:
        pcie.boot_settings([
            {"device_class": "0x0108", "tcs": [1]},
            {"device_class": "0x0108", "tcs": [0]},
            {"device": "0001:01:00.0", "device_class": "0x0108", "tcs": [1]},
            {"tcs": [1]},
            {"device": "01:00", "tcs": [1]},
            {"device_class": "nvme", "tcs": [1]},
            {"device_class": "0x0108", "tcs": [1], "vc_id": 9},
            {"device_class": "0x0108", "tcs": [1], "timeout": 2},
            ["0x0108", [1]],
            {"device_class": "0x0108"},
        ], 1.0, False)
    assert info.value.errors == [
        "mapping 2 (class 0x0108): TC0 cannot be moved: TC0 is always mapped to VC0",
        "mapping 3 (0001:01:00.0): give exactly one of device (a PCI address) and device_class "
        "(a PCI class like 0x0108)",
        "mapping 4: give exactly one of device (a PCI address) and device_class (a PCI class like 0x0108)",
        "mapping 5 (01:00): '01:00' is not a PCI address like 0000:01:00.0",
        "mapping 6 (class nvme): device_class 'nvme' is not a PCI class like 0x0108 (class and subclass) "
        "or 0x010802",
        "mapping 7 (class 0x0108): vc_id 9 is not a VC ID of 1-7 (VC0 is the default VC and is always enabled)",
        "mapping 8 (class 0x0108): unknown keys timeout (a mapping has device or device_class, tcs, vc_id)",
        "mapping 9: ['0x0108', [1]] is not a mapping (device or device_class, tcs, vc_id)",
        "mapping 10 (class 0x0108): tcs must be a non-empty list of traffic classes 1-7, got None",
    ]


@pytest.mark.parametrize("mappings, timeout, fail_unsupported, message", [
    ({"device_class": "0x0108", "tcs": [1]}, 1.0, False, "mappings must be a list of mappings"),
    ([NVME_TC1], 0, False, "mapping 1 (class 0x0108): timeout must be a positive number of seconds, got 0"),
    ([NVME_TC1], "soon", False, "timeout must be a positive number of seconds, got 'soon'"),
    ([NVME_TC1], float("inf"), False, "timeout must be a positive number of seconds, got inf"),
    ([NVME_TC1], 1.0, "maybe", "mapping 1 (class 0x0108): fail_unsupported must be true or false, got 'maybe'"),
    ([NVME_TC1], 1.0, None, "fail_unsupported must be true or false, got None"),
])
def test_boot_settings_refuse_bad_role_settings(mappings, timeout, fail_unsupported, message):
    with pytest.raises(EdgeError) as info:
        pcie.boot_settings(mappings, timeout, fail_unsupported)
    assert message in str(info.value)


# --------------------------------------------------------------------------
# edgetune pcie show

def edgetune(*argv):
    from ansible.utils import display  # noqa: F401  (set up on the real streams, as in a real run, not on these)
    from edgetune import cli

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = cli.main(list(argv))
    finally:
        sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


@pytest.mark.controller
def test_show_table_and_json_on_a_sysfs_tree(twin_link):
    root, _configs = twin_link
    code, out, err = edgetune("pcie", "show", "--sysfs-root", str(root))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["DEVICE", "PORT", "TYPE", "CAPABILITY", "VC", "ID", "ENABLED", "TC/VC", "MAP", "TCS",
                                "NEGOTIATION"]
    assert lines[1].split() == ["0000:00:00.0", "Root", "Port", "VC@0x100", "VC0", "0", "yes", "0x01", "0", "done"]
    assert lines[2].split() == ["0001:00:00.0", "Root", "Port", "VC@0x148", "VC0", "0", "yes", "0xff", "0-7", "done"]
    assert lines[3].split() == ["VC1", "1", "no", "0x00", "-", "pending"]
    code, out, _err = edgetune("pcie", "show", "0001:01:00.0", "--sysfs-root", str(root), "--json")
    device = json.loads(out)["devices"][0]
    assert code == 0 and device["bdf"] == "0001:01:00.0" and device["class"] == "0x010802"
    assert device["vc_capabilities"] == [{
        "offset": 0x148, "type": "VC", "version": 1, "extended_vc_count": 1,
        "vcs": [{"index": 0, "id": 0, "tc_map": 0xFF, "tcs": list(range(8)), "enabled": True,
                 "negotiation_pending": False},
                {"index": 1, "id": 1, "tc_map": 0, "tcs": [], "enabled": False, "negotiation_pending": True}]}]


@pytest.mark.controller
def test_show_a_saved_image(tmp_path):
    image = tmp_path / "hda.bin"
    image.write_bytes(load_dump("ich10-hda-00-1b.0.lspci")[1])
    code, out, _err = edgetune("pcie", "show", "--config", str(image), "--json")
    vc = json.loads(out)["devices"][0]["vc_capabilities"][0]
    assert code == 0 and [(r["id"], r["tc_map"], r["enabled"]) for r in vc["vcs"]] == [(0, 1, True), (1, 0x80, True)]
    mfvc = tmp_path / "mfvc.bin"
    mfvc.write_bytes(mfvc_vc9())
    code, out, _err = edgetune("pcie", "show", "--config", str(mfvc))
    assert code == 0 and "MFVC@0x140" in out and "VC9@0x180" in out
    plain = tmp_path / "p2020.bin"
    plain.write_bytes(load_dump("p2020-root-port-0000-04-00.0.lspci")[1])
    assert "no Virtual Channel capability (VC0 only)" in edgetune("pcie", "show", "--config", str(plain))[1]


@pytest.mark.controller
def test_show_errors_exit_2(twin_link, tmp_path):
    root, (_rp, ep) = twin_link
    code, _out, err = edgetune("pcie", "show", "0001:05:00.0", "--sysfs-root", str(root))
    assert code == 2 and "PCI device 0001:05:00.0 not found" in err
    Path(ep).write_bytes(Path(ep).read_bytes()[:64])
    code, out, err = edgetune("pcie", "show", "--sysfs-root", str(root))
    assert code == 2 and "error: " in out and "run as root" in err
    code, out, _err = edgetune("pcie", "show", "--sysfs-root", str(root), "--json")
    assert code == 2 and "truncated: 64 bytes" in json.loads(out)["devices"][2]["error"]
    code, _out, err = edgetune("pcie", "show", "--config", str(tmp_path / "absent"))
    assert code == 2 and "cannot read" in err


# --------------------------------------------------------------------------
# The drift audit's pcie_vc check: both ends planned from config space

PCIE_CHECK = {"setting": "PCIe class 0x0108 TC 1 on VC ID 1", "role": "edge_pcie_qos", "kind": "pcie_vc",
              "device": None, "device_class": "0x0108", "tcs": [1], "vc_id": 1}


def test_audit_names_both_ends_until_the_mapping_is_made_and_then_is_ok(twin_link, partner, capsys):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import evaluate
    root, (rp, ep) = twin_link
    before = snapshot(root)
    result = evaluate(PCIE_CHECK, str(root))
    assert result["state"] == "drifted"
    assert result["detail"] == ("TC 1 not on VC ID 1: 0001:00:00.0 (upstream port) VC0 Resource Control, "
                                "VC1 Resource Control to rewrite; 0001:01:00.0 (device) VC0 Resource Control, "
                                "VC1 Resource Control to rewrite")
    assert snapshot(root) == before  # the audit reads only
    run_module(dict(NVME_TC1, sysfs_root=str(root)), capsys)
    result = evaluate(PCIE_CHECK, str(root))
    assert result["state"] == "ok" and result["running"]["0001:01:00.0 (device)"]["VC1 Resource Control"] == \
        "0x81000002"
    # Two config bytes moved TC1 back to VC0 on the device end only: drift, that end named.
    data = bytearray(Path(ep).read_bytes())
    struct.pack_into("<I", data, 0x15C, 0x800000FF)
    struct.pack_into("<I", data, 0x168, 0x01000000)
    Path(ep).write_bytes(bytes(data))
    result = evaluate(PCIE_CHECK, str(root))
    assert result["state"] == "drifted" and "0001:01:00.0 (device)" in result["detail"]
    assert "upstream port" not in result["detail"]


def test_audit_of_a_link_without_virtual_channels_is_unsupported(tmp_path):
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_audit import evaluate
    link_tree(tmp_path, spec_image([], class_code=0x060400, port_type=0x4), spec_image([]))
    result = evaluate(PCIE_CHECK, str(tmp_path))
    assert result["state"] == "unsupported" and "no Virtual Channel capability" in result["detail"]
    assert evaluate(dict(PCIE_CHECK, device_class=None, device="0009:01:00.0"), str(tmp_path))["state"] == "error"


def test_the_drift_audit_checks_each_mapping_and_the_state_file_the_boot_reads():
    from ansible_collections.edgetune.fleet.plugins.module_utils.device.edge_pcie import audit_checks
    mappings = [{"device_class": "0x0108", "tcs": [1], "vc_id": 1}, {"device": "0000:01:00.0", "tcs": [2, 3]}]
    found = audit_checks(mappings, "/etc/edgetune/boot.d/pcie-vc.json", '{"state": 1}\n')
    assert found[0] == {"setting": "PCIe class 0x0108 TC 1 on VC ID 1", "role": "edge_pcie_qos", "kind": "pcie_vc",
                        "device": None, "device_class": "0x0108", "tcs": [1], "vc_id": 1}
    assert found[1]["setting"] == "PCIe 0000:01:00.0 TC 2,3 on VC ID 1" and found[1]["device_class"] is None
    assert found[2] == {"setting": "PCIe QoS state file", "role": "edge_pcie_qos", "kind": "file",
                        "path": "/etc/edgetune/boot.d/pcie-vc.json",
                        "sha1": "dcb42aa84d893477d7bedb2cf63d5f7f9ea7c8f8"}
    assert [c["kind"] for c in audit_checks(mappings)] == ["pcie_vc", "pcie_vc"]      # not persisted
    assert audit_checks([], "/etc/edgetune/boot.d/pcie-vc.json", "") == []


def boot_program_names():
    """The module names of the files role edge_boot installs for the boot program (the plan's)."""
    from ansible_collections.edgetune.fleet.plugins.module_utils.plan.edge_package import program_files
    return [f["src"].rsplit("/", 1)[-1][:-len(".py")] for f in program_files("boot")]

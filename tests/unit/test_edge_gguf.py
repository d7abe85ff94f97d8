"""The GGUF reader (plugins/module_utils/bench/edge_gguf.py) on small files this test
writes from the GGUF specification (ggml docs/gguf.md), and on truncated and
corrupt ones, which must be refused with GGUFError, never another exception."""
import struct

import pytest

from ansible_collections.edgetune.fleet.plugins.module_utils.bench import edge_gguf as gguf


# ------------------------------------------------------------------ a writer, from the spec
def s(text):
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def u32(value):
    return struct.pack("<I", value)


def string_array(items):
    return struct.pack("<IQ", 8, len(items)) + b"".join(s(i) for i in items)


def tensor_info(name, shape, ttype, offset):
    return s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + \
        struct.pack("<IQ", ttype, offset)


def write_gguf(path, metadata=None, tensors=None, version=3, alignment=32, data_size=None, magic=b"GGUF"):
    """metadata: [(key, vtype, payload bytes)]; tensors: [(name, shape, ggml type, offset)]."""
    metadata = metadata if metadata is not None else [
        ("general.architecture", 8, s("llama")),
        ("general.name", 8, s("Tiny Test")),
        ("llama.context_length", 4, u32(256)),
        ("general.file_type", 4, u32(3)),
        ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        ("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", True)),
        ("tokenizer.ggml.tokens", 9, string_array(["<s>", "a", "b", "\u00e9"])),
        ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0.5, -1.0, 2.0)),
    ]
    # A Q4_1 matrix 64x2 (4 blocks of 20 bytes) then an F32 vector of 8 at the next aligned offset.
    if tensors is None:
        tensors = [("blk.0.attn_q.weight", [64, 2], 3, 0), ("output_norm.weight", [8], 0, 96)]
    body = magic + struct.pack("<IQQ", version, len(tensors), len(metadata))
    body += b"".join(kv(k, t, p) for k, t, p in metadata)
    body += b"".join(tensor_info(*t) for t in tensors)
    body += b"\0" * ((-len(body)) % alignment)
    data_size = 96 + 32 if data_size is None else data_size
    body += bytes(range(256)) * (data_size // 256) + bytes(data_size % 256)
    path.write_bytes(body)
    return body


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    return path


# ------------------------------------------------------------------ a good file
def test_reads_header_metadata_and_tensors(model):
    parsed = gguf.read(str(model))
    meta = parsed["metadata"]
    assert parsed["version"] == 3 and meta["general.name"] == "Tiny Test"
    assert meta["llama.context_length"] == 256 and meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "a", "b", "\u00e9"]
    assert meta["tokenizer.ggml.scores"] == [0.5, -1.0, 2.0]
    assert meta["llama.rope.freq_base"] == 10000.0
    assert [t["name"] for t in parsed["tensors"]] == ["blk.0.attn_q.weight", "output_norm.weight"]
    assert parsed["tensors"][0]["shape"] == [64, 2] and parsed["tensors"][1]["offset"] == 96
    assert parsed["data_offset"] % 32 == 0 and parsed["data_size"] == 128
    assert parsed["data_offset"] + parsed["data_size"] == parsed["file_size"]


def test_describe_reads_what_a_deploy_needs(model):
    info = gguf.describe(gguf.read(str(model)))
    assert info["name"] == "Tiny Test" and info["architecture"] == "llama"
    assert info["quantization"] == "Q4_1" and info["file_type"] == 3
    assert info["parameters"] == 64 * 2 + 8
    assert info["context_length"] == 256 and info["vocab_size"] == 4
    assert info["tensor_types"] == {"Q4_1": 1, "F32": 1} and info["gguf_version"] == 3


def test_version_2_and_a_custom_alignment(tmp_path):
    path = tmp_path / "v2.gguf"
    meta = [("general.architecture", 8, s("llama")), ("llama.context_length", 4, u32(64)),
            ("general.alignment", 4, u32(64))]
    write_gguf(path, metadata=meta, tensors=[("t", [4], 0, 0)], version=2, alignment=64, data_size=16)
    parsed = gguf.read(str(path))
    assert parsed["version"] == 2 and parsed["data_offset"] % 64 == 0
    info = gguf.describe(parsed)
    assert info["quantization"].startswith("unknown") and info["parameters"] == 4


# ------------------------------------------------------------------ refused cleanly
def test_every_truncation_is_refused(tmp_path, model):
    whole = model.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in range(len(whole)):
        cut.write_bytes(whole[:size])
        with pytest.raises(gguf.GGUFError) as info:
            gguf.read(str(cut))
        message = str(info.value)
        assert str(cut) in message, message
        assert "truncated" in message or "not a GGUF file" in message, (size, message)


@pytest.mark.parametrize("kwargs,message", [
    ({"magic": b"GGML"}, "not a GGUF file"),
    ({"version": 1}, "GGUF version 1 is not supported"),
    ({"tensors": [("t", [1, 1, 1, 1, 1, 1, 1], 0, 0)]}, "has 7 dimensions"),
    ({"tensors": [("t", [8], 0, 4)], "data_size": 64}, "is not aligned to 32"),
    ({"tensors": [("t", [33], 2, 0)]}, "not a multiple of the Q4_0 block of 32"),
    ({"metadata": [("k", 13, b"")]}, "unknown value type 13"),
    ({"metadata": [("k", 8, struct.pack("<Q", 1 << 60))]}, "truncated or corrupt"),
    ({"metadata": [("k", 9, struct.pack("<IQ", 4, 1 << 40))]}, "claims 1099511627776 elements"),
    ({"metadata": [("k\xff".encode("latin-1"), 4, u32(1))]}, "is not UTF-8"),
    ({"metadata": [("general.alignment", 4, u32(24))]}, "not a power of two"),
    ({"metadata": [("k", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 0))]},
     "nests arrays deeper"),
])
def test_corrupt_files_are_refused_with_the_reason(tmp_path, kwargs, message):
    path = tmp_path / "bad.gguf"
    write_gguf(path, **kwargs)
    with pytest.raises(gguf.GGUFError, match=message):
        gguf.read(str(path))


def test_a_header_claiming_more_entries_than_the_file_holds(tmp_path, model):
    data = bytearray(model.read_bytes())
    data[16:24] = struct.pack("<Q", 10 ** 12)  # metadata_kv_count
    path = tmp_path / "count.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(gguf.GGUFError, match="header claims 1000000000000 metadata entries"):
        gguf.read(str(path))


def test_missing_tensor_data_is_truncation(tmp_path):
    path = tmp_path / "short.gguf"
    write_gguf(path, data_size=100)  # the tensors need 128 bytes
    with pytest.raises(gguf.GGUFError, match="the tensors need 128 bytes"):
        gguf.read(str(path))


def test_missing_file_and_non_model(tmp_path):
    with pytest.raises(gguf.GGUFError, match="cannot open"):
        gguf.read(str(tmp_path / "none.gguf"))
    path = tmp_path / "noarch.gguf"
    write_gguf(path, metadata=[("general.name", 8, s("x"))])
    with pytest.raises(gguf.GGUFError, match="no general.architecture"):
        gguf.describe(gguf.read(str(path)))
    path = tmp_path / "noctx.gguf"
    write_gguf(path, metadata=[("general.architecture", 8, s("llama"))])
    with pytest.raises(gguf.GGUFError, match="no llama.context_length"):
        gguf.describe(gguf.read(str(path)))

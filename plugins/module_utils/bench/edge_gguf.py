# Copyright: edgetune contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A reader of GGUF model files (llama.cpp's format), written from the GGUF
specification (ggml's docs/gguf.md): the header, the metadata key/value pairs
and the tensor infos, with every length checked against the file, so a
truncated or corrupt file is refused with one message instead of read wrong.
Python 3.8+, stdlib only (runs on the controller at packaging and on the device).

Layout (little-endian, GGUF version 2 and 3)::

    "GGUF" | uint32 version | uint64 tensor_count | uint64 metadata_kv_count
    metadata_kv_count x (string key, uint32 value_type, value)
    tensor_count x (string name, uint32 n_dims, uint64 dims[n_dims], uint32 ggml_type, uint64 offset)
    padding to general.alignment (default 32), then the tensor data

A string is uint64 length + UTF-8 bytes; an array is uint32 element type,
uint64 count, then the elements.
"""

import struct
from ansible_collections.edgetune.fleet.plugins.module_utils.common.edge_error import BadInput

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 2

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALARS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml tensor types: name, elements per block, bytes per block (ggml.c's type traits).
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}
# general.file_type (llama.h's llama_ftype): what the model is quantized as.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    32: "BF16",
}


class GGUFError(BadInput):
    """A file that is not a readable GGUF model; the message says where and why."""


class _Reader(object):
    def __init__(self, handle, size, path):
        self.handle, self.size, self.path, self.pos = handle, size, path, 0

    def take(self, count, what):
        if count < 0 or self.pos + count > self.size:
            raise GGUFError("%s: truncated or corrupt GGUF: %s needs %d bytes at offset %d, but the file has %d"
                            % (self.path, what, count, self.pos, self.size))
        data = self.handle.read(count)
        if len(data) != count:
            raise GGUFError("%s: short read at offset %d (%s)" % (self.path, self.pos, what))
        self.pos += count
        return data

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        length = self.scalar("<Q", what + " length")
        data = self.take(length, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError("%s: %s at offset %d is not UTF-8" % (self.path, what, self.pos - length)) from None

    def value(self, vtype, what, depth=0):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError("%s: %s nests arrays deeper than %d" % (self.path, what, MAX_ARRAY_DEPTH))
            etype = self.scalar("<I", what + " element type")
            count = self.scalar("<Q", what + " element count")
            # Every element takes at least one byte: a count past the file's end is corruption.
            if count > self.size - self.pos:
                raise GGUFError("%s: truncated or corrupt GGUF: %s claims %d elements at offset %d, "
                                "more than the %d bytes left" % (self.path, what, count, self.pos,
                                                                 self.size - self.pos))
            if etype in SCALARS:
                fmt = SCALARS[etype]
                width = struct.calcsize(fmt)
                data = self.take(width * count, what)
                return list(struct.unpack("<%d%s" % (count, fmt[1]), data))
            return [self.value(etype, what, depth + 1) for _index in range(count)]
        raise GGUFError("%s: %s has unknown value type %d at offset %d" % (self.path, what, vtype, self.pos - 4))


def read(path):
    """Parse a GGUF file's header, metadata and tensor infos.

    Returns {"version", "metadata": {key: value}, "tensors": [{"name", "shape", "type", "offset"}],
    "data_offset", "data_size" (bytes the tensors need, None if a type is unknown), "file_size"}.
    Raises GGUFError for anything that is not a whole, well-formed GGUF file.
    """
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise GGUFError("cannot open %s: %s" % (path, exc.strerror or exc)) from None
    with handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(0)
        r = _Reader(handle, size, path)
        if size < 4 or r.take(4, "magic") != MAGIC:
            raise GGUFError("%s is not a GGUF file (no GGUF magic at its start)" % path)
        version = r.scalar("<I", "version")
        if version not in VERSIONS:
            raise GGUFError("%s: GGUF version %d is not supported (versions %s)"
                            % (path, version, ", ".join(str(v) for v in VERSIONS)))
        n_tensors = r.scalar("<Q", "tensor count")
        n_kv = r.scalar("<Q", "metadata count")
        # A key/value pair takes at least 12 bytes, a tensor info at least 24.
        if n_kv * 12 + n_tensors * 24 > size - r.pos:
            raise GGUFError("%s: truncated or corrupt GGUF: header claims %d metadata entries and %d tensors, "
                            "more than %d bytes can hold" % (path, n_kv, n_tensors, size - r.pos))
        metadata = {}
        for index in range(n_kv):
            key = r.string("metadata key %d" % index)
            vtype = r.scalar("<I", "type of %s" % key)
            metadata[key] = r.value(vtype, "value of %s" % key)
        tensors = []
        for index in range(n_tensors):
            name = r.string("tensor name %d" % index)
            n_dims = r.scalar("<I", "dimensions of %s" % name)
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError("%s: tensor %s has %d dimensions (1 to %d allowed): corrupt GGUF"
                                % (path, name, n_dims, MAX_DIMS))
            shape = [r.scalar("<Q", "shape of %s" % name) for _dim in range(n_dims)]
            ttype = r.scalar("<I", "type of tensor %s" % name)
            offset = r.scalar("<Q", "offset of tensor %s" % name)
            tensors.append({"name": name, "shape": shape, "type": ttype, "offset": offset})
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError("%s: general.alignment %r is not a power of two" % (path, alignment))
        data_offset = (r.pos + alignment - 1) // alignment * alignment
    data_size = 0
    for tensor in tensors:
        nbytes = tensor_bytes(tensor)
        if nbytes is None:
            data_size = None
            break
        if tensor["offset"] % alignment:
            raise GGUFError("%s: tensor %s's offset %d is not aligned to %d: corrupt GGUF"
                            % (path, tensor["name"], tensor["offset"], alignment))
        data_size = max(data_size, tensor["offset"] + nbytes)
    if data_size is not None and data_offset + data_size > size:
        raise GGUFError("%s: truncated GGUF: the tensors need %d bytes from offset %d, but the file has %d"
                        % (path, data_size, data_offset, size))
    return {"version": version, "metadata": metadata, "tensors": tensors, "data_offset": data_offset,
            "data_size": data_size, "file_size": size}


def tensor_bytes(tensor):
    """Bytes of a tensor's data from its type and shape; None for a type this reader does not know."""
    known = GGML_TYPES.get(tensor["type"])
    if known is None:
        return None
    _name, block, width = known
    count = elements(tensor["shape"])
    if tensor["shape"][0] % block:
        raise GGUFError("tensor %s: first dimension %d is not a multiple of the %s block of %d"
                        % (tensor["name"], tensor["shape"][0], known[0], block))
    return count // block * width


def elements(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


def describe(parsed):
    """What a deploy needs to know of a model, read from the file (never guessed from its name)."""
    meta = parsed["metadata"]
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError("the GGUF has no general.architecture: not a model llama.cpp can load")
    context = meta.get("%s.context_length" % arch)
    if not isinstance(context, int) or context <= 0:
        raise GGUFError("the GGUF has no %s.context_length" % arch)
    file_type = meta.get("general.file_type")
    types = {}
    for tensor in parsed["tensors"]:
        name = GGML_TYPES.get(tensor["type"], ("type%d" % tensor["type"],))[0]
        types[name] = types.get(name, 0) + 1
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "name": meta.get("general.name") or "",
        "architecture": arch,
        "quantization": FILE_TYPES.get(file_type, "unknown file_type %s" % file_type) if file_type is not None
        else "unknown (no general.file_type)",
        "file_type": file_type,
        "parameters": sum(elements(t["shape"]) for t in parsed["tensors"]),
        "context_length": context,
        "tensors": len(parsed["tensors"]),
        "tensor_types": types,
        "vocab_size": len(tokens) if isinstance(tokens, list) else None,
        "gguf_version": parsed["version"],
    }

#!/usr/bin/python3
"""A small, independent GGUF writer for tests (standard library only).

Writes GGUF v2/v3 files byte by byte from the published format (see
common/gguf.h for the layout): header, typed metadata, tensor infos,
alignment padding, tensor data. It validates nothing on purpose, so that
tests/fuzz/make_gguf_corpus.py can also write broken files: every field can
be overridden.

    w = GGUFWriter(version=3)
    w.add("general.architecture", STRING, "qwen3moe")
    w.add("qwen3moe.block_count", UINT32, 2)
    w.add("tokenizer.ggml.tokens", ARRAY, ["a", "b"], elem=STRING)
    w.add_tensor("blk.0.ffn_gate_exps.weight", Q8_0, [64, 32, 4], raw_bytes)
    w.write(path)   # or w.to_bytes()

Tensor dims are in ggml order (dims[0] is the row length). Tensor data is
placed back to back, each at the next multiple of the alignment, unless an
explicit offset is given.
"""
import struct

# Metadata value types (gguf_type).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, \
    UINT64, INT64, FLOAT64 = range(13)

# Tensor types (ggml_type) and their (weights, bytes) per block.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
I8, I16, I32, I64, F64, BF16, MXFP4 = 24, 25, 26, 27, 28, 30, 39
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), F64: (1, 8), I8: (1, 1),
         I16: (1, 2), I32: (1, 4), I64: (1, 8),
         Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24),
         Q8_0: (32, 34), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144),
         Q5_K: (256, 176), Q6_K: (256, 210), Q8_K: (256, 292), MXFP4: (32, 17)}
TYPE_NAMES = {F32: "F32", F16: "F16", BF16: "BF16", F64: "F64", I8: "I8",
              I16: "I16", I32: "I32", I64: "I64", Q4_0: "Q4_0", Q4_1: "Q4_1",
              Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K",
              Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K",
              Q8_K: "Q8_K", MXFP4: "MXFP4"}

_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I",
           INT32: "<i", FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q",
           FLOAT64: "<d"}


def tensor_nbytes(ggml_type, dims):
    per, size = BLOCK[ggml_type]
    n = 1
    for d in dims:
        n *= d
    return n // per * size


def enc_string(s):
    b = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype, value, elem=None):
    """The encoding of a value of type `vtype` (without the type tag)."""
    if vtype == STRING:
        return enc_string(value)
    if vtype == ARRAY:
        out = struct.pack("<IQ", elem, len(value))
        return out + b"".join(enc_value(elem, v) for v in value)
    return struct.pack(_SCALAR[vtype], value)


class GGUFWriter:
    def __init__(self, version=3, alignment=None, magic=b"GGUF"):
        self.version = version
        self.magic = magic
        self.alignment = 32 if alignment is None else alignment
        self.kv = []        # (key, type tag, encoded value)
        self.tensors = []   # dicts: name, dims, type, data, offset
        if alignment is not None:
            self.add("general.alignment", UINT32, alignment)

    def add(self, key, vtype, value, elem=None):
        self.kv.append((key, vtype, enc_value(vtype, value, elem)))

    def add_raw(self, key, vtype, encoded):
        """A key with a hand-made encoding (for malformed files)."""
        self.kv.append((key, vtype, encoded))

    def add_tensor(self, name, ggml_type, dims, data, offset=None):
        self.tensors.append({"name": name, "type": ggml_type, "dims": list(dims),
                             "data": bytes(data), "offset": offset})

    def layout(self):
        """Fills each tensor's offset (relative to the data section)."""
        pos = 0
        for t in self.tensors:
            if t["offset"] is None:
                pos += -pos % self.alignment
                t["offset"] = pos
            pos = max(pos, t["offset"] + len(t["data"]))
        return pos

    def header_bytes(self, tensor_count=None, kv_count=None):
        self.layout()
        out = [self.magic, struct.pack("<I", self.version)]
        out.append(struct.pack("<QQ", len(self.tensors) if tensor_count is None
                               else tensor_count,
                               len(self.kv) if kv_count is None else kv_count))
        for key, vtype, enc in self.kv:
            out.append(enc_string(key) + struct.pack("<I", vtype) + enc)
        for t in self.tensors:
            out.append(enc_string(t["name"]) + struct.pack("<I", len(t["dims"])))
            out.append(b"".join(struct.pack("<Q", d) for d in t["dims"]))
            out.append(struct.pack("<IQ", t["type"], t["offset"]))
        return b"".join(out)

    def to_bytes(self, tensor_count=None, kv_count=None):
        head = self.header_bytes(tensor_count, kv_count)
        head += b"\0" * (-len(head) % self.alignment)
        self.layout()
        # Tensors placed absurdly far (malformed files) get no bytes.
        placed = [t for t in self.tensors if t["offset"] + len(t["data"]) <= 1 << 30]
        data = bytearray(max([t["offset"] + len(t["data"]) for t in placed] + [0]))
        for t in placed:
            data[t["offset"]:t["offset"] + len(t["data"])] = t["data"]
        return head + bytes(data)

    def data_offset(self):
        n = len(self.header_bytes())
        return n + (-n % self.alignment)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def split_path(prefix, part, count):
    return "%s-%05d-of-%05d.gguf" % (prefix, part, count)


def split_writers(writer, parts):
    """Splits `writer`'s tensors into `parts` files as gguf-split does: all
    metadata in the first part, split.no / split.count / split.tensors.count
    in every part. Returns the writers, part 1 first."""
    out = []
    per = -(-len(writer.tensors) // parts)
    for k in range(parts):
        w = GGUFWriter(version=writer.version)
        if k == 0:
            w.kv = list(writer.kv)
            w.alignment = writer.alignment
        w.add("split.no", UINT16, k)
        w.add("split.count", UINT16, parts)
        w.add("split.tensors.count", INT32, len(writer.tensors))
        for t in writer.tensors[k * per:(k + 1) * per]:
            w.add_tensor(t["name"], t["type"], t["dims"], t["data"])
        out.append(w)
    return out

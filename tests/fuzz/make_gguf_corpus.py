#!/usr/bin/python3
"""Regenerates tests/fuzz/corpus/gguf/ (committed; make_corpus.py calls this
too, after clearing the corpus).

Malformed GGUF files, each with the error it must produce, and valid seeds
that fuzz_gguf mutates. corpus/gguf/expected.txt has one line per entry,
"<path>\\t<substring of the error>" or "<path>\\tOK", paths relative to
corpus/gguf; each is opened with GgufCheckpoint::Open (gguf_corpus_test.cc).
Files are written with the independent writer in tests/reference/.
"""
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gguf_writer as g  # noqa: E402

ROOT = os.path.join(HERE, "corpus", "gguf")
expected = []


def put(rel, blob, expect):
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)
    if expect is not None:
        expected.append((rel, expect))


def pattern(n, seed=1):
    return bytes((seed * 37 + 11 * i) & 0xFF for i in range(n))


def base(version=3, alignment=None, tensors=True):
    w = g.GGUFWriter(version=version, alignment=alignment)
    w.add("general.architecture", g.STRING, "qwen3moe")
    w.add("general.name", g.STRING, "corpus")
    w.add("qwen3moe.block_count", g.UINT32, 1)
    w.add("qwen3moe.rope.freq_base", g.FLOAT32, 10000.0)
    w.add("qwen3moe.expert_used_count", g.INT32, 2)
    w.add("tokenizer.ggml.tokens", g.ARRAY, ["<s>", "a", "b"], elem=g.STRING)
    w.add("tokenizer.ggml.scores", g.ARRAY, [0.0, -1.0, -2.0], elem=g.FLOAT32)
    w.add("tokenizer.ggml.add_bos_token", g.BOOL, 1)
    if tensors:
        specs = [("token_embd.weight", g.F32, [8, 3]),
                 ("blk.0.attn_norm.weight", g.F16, [8]),
                 ("blk.0.ffn_gate_exps.weight", g.Q8_0, [32, 2, 2]),
                 ("blk.0.ffn_down_exps.weight", g.Q4_K, [256, 1, 2]),
                 ("blk.0.ffn_up_exps.weight", g.MXFP4, [32, 2, 2]),
                 ("output.weight", g.Q6_K, [256, 1]),
                 ("output_norm.weight", g.BF16, [8])]
        for k, (name, t, dims) in enumerate(specs):
            w.add_tensor(name, t, dims, pattern(g.tensor_nbytes(t, dims), k + 1))
    return w


def one_tensor(t=g.F32, dims=(4,), offset=None, data=None, name="a"):
    w = g.GGUFWriter()
    w.add("general.architecture", g.STRING, "llama")
    n = g.tensor_nbytes(t, dims) if t in g.BLOCK else 16
    n = min(n, 4096)  # dims may be absurd on purpose
    w.add_tensor(name, t, dims, pattern(n) if data is None else data, offset)
    return w


def with_kv(key, vtype, value, elem=None):
    w = base(tensors=False)
    w.add(key, vtype, value, elem)
    return w.to_bytes()


def raw_kv(key, vtype, encoded):
    w = base(tensors=False)
    w.add_raw(key, vtype, encoded)
    return w.to_bytes()


def valid_cases():
    put("valid_v3.gguf", base().to_bytes(), "OK")
    put("valid_v2.gguf", base(version=2).to_bytes(), "OK")
    put("valid_align64.gguf", base(alignment=64).to_bytes(), "OK")
    put("valid_no_tensors.gguf", base(tensors=False).to_bytes(), "OK")
    parts = g.split_writers(base(), 2)
    for k, w in enumerate(parts):
        put("split_ok/m-%05d-of-00002.gguf" % (k + 1), w.to_bytes(),
            "OK" if k == 0 else None)


def header_cases():
    ok = base().to_bytes()
    put("bad_empty.gguf", b"", "too small for the 24-byte GGUF header")
    put("bad_truncated_header.gguf", ok[:20], "too small for the 24-byte GGUF header")
    put("bad_magic.gguf", b"GGML" + ok[4:], "not a GGUF file")
    put("bad_version_1.gguf", g.GGUFWriter(version=1).to_bytes() + bytes(8),
        "GGUF version 1 is not supported")
    put("bad_version_4.gguf", g.GGUFWriter(version=4).to_bytes() + bytes(8),
        "GGUF version 4 is not supported")
    put("bad_big_endian.gguf", g.GGUFWriter(version=3 << 24).to_bytes() + bytes(8),
        "looks like a big-endian GGUF")
    put("bad_tensor_count.gguf", base().to_bytes(tensor_count=1 << 63),
        "tensor count 9223372036854775808 cannot fit")
    put("bad_metadata_count.gguf", base().to_bytes(kv_count=(1 << 64) - 1),
        "metadata count 18446744073709551615 cannot fit")
    put("bad_kv_count_past_eof.gguf", base(tensors=False).header_bytes(kv_count=9),
        "metadata key #8 length at byte")
    put("bad_truncated_tensor_info.gguf", ok[:ok.index(b"blk.0.attn_norm") + 22],
        "dimension count of tensor 'blk.0.attn_norm.weight' at byte")


def metadata_cases():
    w = base(tensors=False)
    w.kv[0] = ("", g.STRING, g.enc_value(g.STRING, "x"))
    put("bad_empty_key.gguf", w.to_bytes(), "metadata key #0 is empty")
    w = g.GGUFWriter()
    put("bad_key_too_long.gguf",
        w.header_bytes(kv_count=1) + struct.pack("<Q", 65536) + b"k" * 64,
        "metadata key #0 length 65536 exceeds")
    w = base(tensors=False)
    w.kv[0] = ("general.architecture", g.STRING, struct.pack("<Q", 1 << 62))
    put("bad_key_length_huge.gguf", w.to_bytes(),
        "metadata key 'general.architecture' at byte")
    put("bad_duplicate_key.gguf", with_kv("general.name", g.STRING, "again"),
        "duplicate metadata key 'general.name'")
    put("bad_value_type.gguf", raw_kv("x.y", 13, b"\0" * 8),
        "metadata key 'x.y' has unknown value type 13")
    put("bad_nested_array.gguf",
        raw_kv("x.y", g.ARRAY, struct.pack("<IQ", g.ARRAY, 1) + struct.pack("<IQ", g.UINT8, 0)),
        "metadata key 'x.y' is an array of arrays")
    put("bad_array_elem_type.gguf", raw_kv("x.y", g.ARRAY, struct.pack("<IQ", 99, 0)),
        "unknown array element type 99")
    put("bad_array_bytes_overflow.gguf",
        raw_kv("x.y", g.ARRAY, struct.pack("<IQ", g.UINT64, 1 << 62)),
        "array of 4611686018427387904 UINT64) is larger than 2^64 bytes")
    put("bad_array_truncated.gguf",
        raw_kv("x.y", g.ARRAY, struct.pack("<IQ", g.UINT32, 1000) + bytes(40)),
        "metadata key 'x.y' (array of 1000 UINT32) at byte")
    put("bad_string_array_count.gguf",
        raw_kv("x.y", g.ARRAY, struct.pack("<IQ", g.STRING, 1 << 60)),
        "(array of 1152921504606846976 STRING) cannot fit")
    put("bad_bool_value.gguf", raw_kv("x.flag", g.BOOL, b"\x02"),
        "metadata key 'x.flag' is a BOOL of value 2")
    put("bad_bool_array.gguf", with_kv("x.flags", g.ARRAY, [1, 0, 7], elem=g.BOOL),
        "metadata key 'x.flags' element 2 is a BOOL of value 7")
    put("bad_alignment_zero.gguf", with_kv("general.alignment", g.UINT32, 0),
        "general.alignment is 0, expected a power of two")
    put("bad_alignment_48.gguf", with_kv("general.alignment", g.UINT32, 48),
        "general.alignment is 48, expected a power of two")
    put("bad_alignment_type.gguf", with_kv("general.alignment", g.UINT64, 32),
        "general.alignment is UINT64, expected UINT32")


def tensor_cases():
    def bad(name, w, msg):
        put("bad_%s.gguf" % name, w.to_bytes() if hasattr(w, "to_bytes") else w, msg)

    bad("tensor_zero_dims", one_tensor(dims=()), "tensor 'a' has 0 dimensions")
    bad("tensor_five_dims", one_tensor(dims=(1, 1, 1, 1, 1)), "tensor 'a' has 5 dimensions")
    bad("tensor_dim_zero", one_tensor(dims=(4, 0)), "tensor 'a' dimension 1 is 0")
    bad("tensor_numel_overflow", one_tensor(dims=(1 << 32, 1 << 32)),
        "tensor 'a' element count overflows int64 (dimension 1 is 4294967296)")
    bad("tensor_dim_huge", one_tensor(dims=((1 << 64) - 1,)),
        "element count overflows int64 (dimension 0 is 18446744073709551615)")
    bad("tensor_type_removed", one_tensor(t=4), "tensor 'a' has unknown ggml type 4")
    bad("tensor_type_huge", one_tensor(t=0xFFFFFFFF), "has unknown ggml type 4294967295")
    bad("tensor_row_not_block", one_tensor(t=g.Q4_K, dims=(128, 2), data=bytes(288)),
        "tensor 'a' row length 128 is not a multiple of the Q4_K block size 256")
    bad("tensor_row_not_block_q8", one_tensor(t=g.Q8_0, dims=(48,), data=bytes(64)),
        "row length 48 is not a multiple of the Q8_0 block size 32")
    bad("tensor_offset_unaligned", one_tensor(offset=8),
        "tensor 'a' offset 8 is not a multiple of the alignment 32")
    w = one_tensor(dims=(64,))
    bad("tensor_past_eof", w.to_bytes()[:-4], "tensor 'a' bytes [0, +256) run past the end")
    bad("tensor_offset_huge", one_tensor(offset=(1 << 64) - 32),
        "run past the end of the data section")
    w = one_tensor(dims=(16,))
    w.add_tensor("b", g.F32, [16], pattern(64), offset=32)
    bad("tensor_overlap", w, "tensors 'a' [0, 64) and 'b' [32, 96) overlap")
    w = one_tensor()
    w.add_tensor("a", g.F32, [4], pattern(16))
    bad("tensor_duplicate", w, "duplicate tensor name 'a'")
    bad("tensor_empty_name", one_tensor(name=""), "tensor #0 has an empty name")
    bad("tensor_name_too_long",
        g.GGUFWriter().header_bytes(tensor_count=1) + struct.pack("<Q", 70000) + b"n" * 64,
        "name of tensor #0 length 70000 exceeds the limit of 65535")
    bad("tensor_data_truncated_q6k", one_tensor(t=g.Q6_K, dims=(256, 2), data=bytes(300)),
        "tensor 'a' bytes [0, +420) run past the end")


def split_cases():
    w = base(tensors=False)
    w.add("split.count", g.UINT16, 2)
    put("bad_split_count_alone.gguf", w.to_bytes(), "has split.count without split.no")
    w = base(tensors=False)
    w.add("split.no", g.UINT16, 2)
    w.add("split.count", g.UINT16, 2)
    put("bad_split_no_too_big.gguf", w.to_bytes(), "split.no is 2 but split.count is 2")
    w = base(tensors=False)
    w.add("split.no", g.UINT16, 0)
    w.add("split.count", g.STRING, "2")
    put("bad_split_count_string.gguf", w.to_bytes(),
        "metadata key 'split.count' is STRING, expected an integer")
    w = base(tensors=False)
    w.add("split.no", g.INT32, -1)
    w.add("split.count", g.UINT16, 2)
    put("bad_split_no_negative.gguf", w.to_bytes(), "metadata key 'split.no' is -1")
    parts = g.split_writers(base(), 2)
    put("bad_split_unnamed.gguf", parts[0].to_bytes(),
        "split.count is 2 but the name is not a part's")
    # A part is missing.
    put("split_missing_part/m-00001-of-00002.gguf", parts[0].to_bytes(),
        "m-00002-of-00002.gguf")
    # The second part says it is the first.
    wrong = g.split_writers(base(), 2)
    wrong[1].kv[0] = ("split.no", g.UINT16, g.enc_value(g.UINT16, 0))
    for k, p in enumerate(wrong):
        put("split_wrong_no/m-%05d-of-00002.gguf" % (k + 1), p.to_bytes(),
            "split.no 0 and split.count 2 do not match the name (expected 1 and 2)"
            if k == 0 else None)
    # split.tensors.count disagrees with the parts.
    bad_count = g.split_writers(base(), 2)
    bad_count[0].kv[-1] = ("split.tensors.count", g.INT32, g.enc_value(g.INT32, 5))
    for k, p in enumerate(bad_count):
        put("split_tensor_count/m-%05d-of-00002.gguf" % (k + 1), p.to_bytes(),
            "split.tensors.count is 5 but the 2 part(s) hold 7 tensors" if k == 0 else None)
    # The same tensor in both parts.
    dup = g.split_writers(base(), 2)
    t = dup[0].tensors[0]
    dup[1].add_tensor(t["name"], t["type"], t["dims"], t["data"])
    for p in dup:
        p.kv[-1] = ("split.tensors.count", g.INT32, g.enc_value(g.INT32, 8))
    for k, p in enumerate(dup):
        put("split_duplicate_tensor/m-%05d-of-00002.gguf" % (k + 1), p.to_bytes(),
            "tensor 'token_embd.weight' is in both" if k == 0 else None)
    # The second part has no split keys at all.
    plain = g.split_writers(base(), 2)
    plain[1].kv = []
    for k, p in enumerate(plain):
        put("split_part_without_keys/m-%05d-of-00002.gguf" % (k + 1), p.to_bytes(),
            "part 2 of 2 lacks split.count" if k == 0 else None)


def llama_vocab(scores_cut=0, types_cut=0):
    """A small SentencePiece ("llama") vocabulary, optionally with its scores
    or token types cut short."""
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xB6>", "\u2581", "H", "e",
              "l", "o", "w", "r", "d", "he", "ll", "\u2581he", "\u2581w", "or", "ld",
              "[INST]", "<|x|>"]
    scores = [0.0] * 6 + [-10.0 - k for k in range(8)] + [-1.0, -2.0, -1.5, -3.0, -2.5,
                                                        -3.5, 0.0, 0.0]
    types = [2, 3, 3, 6, 6, 6] + [1] * 14 + [3, 4]
    w = g.GGUFWriter()
    w.add("general.architecture", g.STRING, "llama")
    w.add("tokenizer.ggml.model", g.STRING, "llama")
    w.add("tokenizer.ggml.tokens", g.ARRAY, tokens, elem=g.STRING)
    w.add("tokenizer.ggml.scores", g.ARRAY, scores[:len(scores) - scores_cut], elem=g.FLOAT32)
    w.add("tokenizer.ggml.token_type", g.ARRAY, types[:len(types) - types_cut], elem=g.INT32)
    w.add("tokenizer.ggml.bos_token_id", g.UINT32, 1)
    w.add("tokenizer.ggml.eos_token_id", g.UINT32, 2)
    w.add("tokenizer.ggml.add_bos_token", g.BOOL, 1)
    w.add("tokenizer.ggml.add_space_prefix", g.BOOL, 1)
    return w.to_bytes()


def vocab_cases():
    # Well-formed GGUF files (seeds for fuzz_gguf, which also builds their
    # tokenizer); whether the tokenizer accepts them is checked by
    # tests/engine/tokenizer_spm_test.cc.
    put("vocab_llama.gguf", llama_vocab(), "OK")
    put("vocab_llama_short_scores.gguf", llama_vocab(scores_cut=1), "OK")
    put("vocab_llama_short_types.gguf", llama_vocab(types_cut=3), "OK")


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    valid_cases()
    header_cases()
    metadata_cases()
    tensor_cases()
    split_cases()
    vocab_cases()
    with open(os.path.join(ROOT, "expected.txt"), "w") as f:
        f.write("# path<TAB>expected error substring, or OK (see make_gguf_corpus.py)\n")
        for rel, msg in sorted(expected):
            f.write("%s\t%s\n" % (rel, msg))
    print("gguf: %d entries (%d malformed)" % (
        len(expected), sum(1 for _, m in expected if m != "OK")))


if __name__ == "__main__":
    main()

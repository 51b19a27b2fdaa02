#!/usr/bin/python3
"""GGUF (ggml) weight blocks in numpy: quantizers and float64 dequantizers
written from the published block layouts (see common/gguf_blocks.h for the
layouts in words). Independent of our C++ decoder, which is tested against
dequantize() here (kernels/gguf_blocks_test.cc).

The quantizers are simple round-to-nearest schemes that fill every field of
a block (scales, mins, high bits); they need not pick the scales llama.cpp
picks, only produce valid blocks whose dequantization is close to the input.

    gguf_quants.py OUT.gguf [SEED]
writes, for each type T, "T.quantized" (quantized random rows) and "T.random"
(blocks of random bits with finite f16 scales), each with "<name>.expected":
the float64 dequantization as an F64 tensor of the same dims.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_writer as g  # noqa: E402

FP4_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                       dtype=np.float64)


def f16(x):
    """Round to the nearest f16; returns (value as float64, 2 bytes)."""
    h = np.float16(x)
    return float(h), h.tobytes()


def f16_at(b, off):
    return float(np.frombuffer(bytes(b[off:off + 2]), dtype="<f2")[0])


# ------------------------------------------------------------ dequantizers

def deq_q8_0(b):
    return f16_at(b, 0) * np.frombuffer(bytes(b[2:34]), dtype=np.int8).astype(np.float64)


def _nibbles(qs):
    qs = np.frombuffer(bytes(qs), dtype=np.uint8).astype(np.int64)
    return np.concatenate([qs & 0xF, qs >> 4])   # weights 0-15, then 16-31


def _fifth_bits(qh4):
    qh = int.from_bytes(bytes(qh4), "little")
    return np.array([(qh >> j) & 1 for j in range(32)], dtype=np.int64)


def deq_q4_0(b):
    return f16_at(b, 0) * (_nibbles(b[2:18]) - 8)


def deq_q4_1(b):
    return f16_at(b, 0) * _nibbles(b[4:20]) + f16_at(b, 2)


def deq_q5_0(b):
    return f16_at(b, 0) * ((_nibbles(b[6:22]) | (_fifth_bits(b[2:6]) << 4)) - 16)


def deq_q5_1(b):
    q = _nibbles(b[8:24]) | (_fifth_bits(b[4:8]) << 4)
    return f16_at(b, 0) * q + f16_at(b, 2)


def k_scales(s):
    """The 8 (scale, min) pairs of 6 bits packed in 12 bytes."""
    s = list(s)
    sc, mn = [0] * 8, [0] * 8
    for j in range(4):
        sc[j], mn[j] = s[j] & 63, s[j + 4] & 63
        sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4)
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4)
    return sc, mn


def _k_quants(b, qs_off, qh_off):
    """Q4_K / Q5_K quant values (0..15 or 0..31) of the 256 weights."""
    qs = np.frombuffer(bytes(b[qs_off:qs_off + 128]), dtype=np.uint8).astype(np.int64)
    q = np.zeros(256, dtype=np.int64)
    for c in range(4):                        # 64 weights per 32 bytes
        q[64 * c:64 * c + 32] = qs[32 * c:32 * c + 32] & 0xF
        q[64 * c + 32:64 * c + 64] = qs[32 * c:32 * c + 32] >> 4
        if qh_off is not None:
            qh = np.frombuffer(bytes(b[qh_off:qh_off + 32]), dtype=np.uint8).astype(np.int64)
            q[64 * c:64 * c + 32] |= ((qh >> (2 * c)) & 1) << 4
            q[64 * c + 32:64 * c + 64] |= ((qh >> (2 * c + 1)) & 1) << 4
    return q


def _deq_k(b, qh_off, qs_off):
    d, dmin = f16_at(b, 0), f16_at(b, 2)
    sc, mn = k_scales(b[4:16])
    q = _k_quants(b, qs_off, qh_off)
    sub = np.arange(256) // 32
    return d * np.array(sc, dtype=np.float64)[sub] * q - dmin * np.array(mn, dtype=np.float64)[sub]


def deq_q4_k(b):
    return _deq_k(b, None, 16)


def deq_q5_k(b):
    return _deq_k(b, 16, 48)


def q6_k_quants(b):
    ql = np.frombuffer(bytes(b[0:128]), dtype=np.uint8).astype(np.int64)
    qh = np.frombuffer(bytes(b[128:192]), dtype=np.uint8).astype(np.int64)
    q = np.zeros(256, dtype=np.int64)
    for h in range(2):
        L, H = ql[64 * h:64 * h + 64], qh[32 * h:32 * h + 32]
        base = 128 * h
        q[base:base + 32] = (L[:32] & 0xF) | ((H & 3) << 4)
        q[base + 32:base + 64] = (L[32:] & 0xF) | (((H >> 2) & 3) << 4)
        q[base + 64:base + 96] = (L[:32] >> 4) | (((H >> 4) & 3) << 4)
        q[base + 96:base + 128] = (L[32:] >> 4) | (((H >> 6) & 3) << 4)
    return q - 32


def deq_q6_k(b):
    sc = np.frombuffer(bytes(b[192:208]), dtype=np.int8).astype(np.float64)
    return f16_at(b, 208) * sc[np.arange(256) // 16] * q6_k_quants(b)


def deq_mxfp4(b):
    scale = 2.0 ** (int(b[0]) - 127)           # E8M0
    return FP4_DOUBLED[_nibbles(b[1:17])] / 2 * scale


DEQ = {g.Q8_0: deq_q8_0, g.Q4_0: deq_q4_0, g.Q4_1: deq_q4_1, g.Q5_0: deq_q5_0,
       g.Q5_1: deq_q5_1, g.Q4_K: deq_q4_k, g.Q5_K: deq_q5_k, g.Q6_K: deq_q6_k,
       g.MXFP4: deq_mxfp4}


def dequantize(t, data):
    per, size = g.BLOCK[t]
    blocks = [data[k:k + size] for k in range(0, len(data), size)]
    return np.concatenate([DEQ[t](b) for b in blocks])


# -------------------------------------------------------------- quantizers

def _pack_nibbles(q):
    q = np.asarray(q, dtype=np.int64)
    return bytes(((q[:16] & 0xF) | ((q[16:] & 0xF) << 4)).astype(np.uint8))


def _pack_fifth(q):
    bits = 0
    for j, v in enumerate(q):
        bits |= ((int(v) >> 4) & 1) << j
    return bits.to_bytes(4, "little")


def _signed_max(x):
    return x[np.argmax(np.abs(x))]


def quant_q8_0(x):
    d, db = f16(np.max(np.abs(x)) / 127)
    q = np.clip(np.round(x / d), -128, 127) if d else np.zeros(32)
    return db + q.astype(np.int8).tobytes()


def quant_q4_0(x, levels=16):
    d, db = f16(_signed_max(x) / -(levels // 2))
    q = np.clip(np.round(x / d) + levels // 2, 0, levels - 1) if d else np.full(32, levels // 2)
    return db, q.astype(np.int64)


def quant_q4_1(x, levels=16):
    lo, hi = np.min(x), np.max(x)
    d, db = f16((hi - lo) / (levels - 1))
    m, mb = f16(lo)
    q = np.clip(np.round((x - m) / d), 0, levels - 1) if d else np.zeros(32)
    return db + mb, q.astype(np.int64)


QUANT_SMALL = {
    g.Q4_0: lambda x: (lambda db, q: db + _pack_nibbles(q))(*quant_q4_0(x)),
    g.Q4_1: lambda x: (lambda h, q: h + _pack_nibbles(q))(*quant_q4_1(x)),
    g.Q5_0: lambda x: (lambda db, q: db + _pack_fifth(q) + _pack_nibbles(q))(
        *quant_q4_0(x, 32)),
    g.Q5_1: lambda x: (lambda h, q: h + _pack_fifth(q) + _pack_nibbles(q))(
        *quant_q4_1(x, 32)),
}


def pack_k_scales(sc, mn):
    out = [0] * 12
    for j in range(4):
        out[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        out[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
        out[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
    return bytes(out)


def quant_k(x, levels):
    """Q4_K (levels 16) or Q5_K (32): per 32 weights a 6-bit scale and min."""
    sub = x.reshape(8, 32)
    mins = np.maximum(0, -np.min(sub, axis=1))
    scales = (np.max(sub, axis=1) + mins) / (levels - 1)
    d, db = f16(np.max(scales) / 63)
    dmin, mb = f16(np.max(mins) / 63)
    sc = np.clip(np.round(scales / d), 0, 63).astype(int) if d else np.zeros(8, int)
    mn = np.clip(np.round(mins / dmin), 0, 63).astype(int) if dmin else np.zeros(8, int)
    q = np.zeros((8, 32), dtype=np.int64)
    for s in range(8):
        if sc[s]:
            q[s] = np.clip(np.round((sub[s] + dmin * mn[s]) / (d * sc[s])), 0, levels - 1)
    q = q.reshape(256)
    qs = bytearray(128)
    qh = bytearray(32)
    for c in range(4):
        for l in range(32):
            a, b = q[64 * c + l], q[64 * c + 32 + l]
            qs[32 * c + l] = (a & 0xF) | ((b & 0xF) << 4)
            qh[l] |= ((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1))
    head = db + mb + pack_k_scales(sc, mn)
    return head + (bytes(qh) if levels == 32 else b"") + bytes(qs)


def quant_q6_k(x):
    sub = x.reshape(16, 16)
    scales = np.array([_signed_max(s) for s in sub]) / -32
    d, db = f16(np.max(np.abs(scales)) / 127)
    sc = np.clip(np.round(scales / d), -128, 127).astype(int) if d else np.zeros(16, int)
    q = np.full((16, 16), 32, dtype=np.int64)
    for s in range(16):
        if sc[s]:
            q[s] = np.clip(np.round(sub[s] / (d * sc[s])) + 32, 0, 63)
    q = q.reshape(256)
    ql, qh = bytearray(128), bytearray(64)
    for h in range(2):
        for l in range(32):
            e = [q[128 * h + l + 32 * k] for k in range(4)]
            ql[64 * h + l] = (e[0] & 0xF) | ((e[2] & 0xF) << 4)
            ql[64 * h + l + 32] = (e[1] & 0xF) | ((e[3] & 0xF) << 4)
            qh[32 * h + l] = sum(((e[k] >> 4) & 3) << (2 * k) for k in range(4))
    return bytes(ql) + bytes(qh) + sc.astype(np.int8).tobytes() + db


def quant_mxfp4(x):
    amax = np.max(np.abs(x))
    e = 0 if amax == 0 else int(np.clip(np.ceil(np.log2(amax / 6)) + 127, 0, 254))
    values = FP4_DOUBLED / 2 * 2.0 ** (e - 127)
    codes = np.argmin(np.abs(x[:, None] - values[None, :]), axis=1)
    return bytes([e]) + _pack_nibbles(codes)


QUANT = dict(QUANT_SMALL)
QUANT.update({g.Q8_0: quant_q8_0, g.Q4_K: lambda x: quant_k(x, 16),
              g.Q5_K: lambda x: quant_k(x, 32), g.Q6_K: quant_q6_k,
              g.MXFP4: quant_mxfp4})


def quantize(t, x):
    per, _ = g.BLOCK[t]
    x = np.asarray(x, dtype=np.float64).reshape(-1, per)
    return b"".join(QUANT[t](row) for row in x)


# ---------------------------------------------------------------- test data

# Byte offsets of each type's f16 fields, made finite in random blocks.
F16_FIELDS = {g.Q8_0: [0], g.Q4_0: [0], g.Q4_1: [0, 2], g.Q5_0: [0], g.Q5_1: [0, 2],
              g.Q4_K: [0, 2], g.Q5_K: [0, 2], g.Q6_K: [208], g.MXFP4: []}


def random_blocks(rng, t, count):
    per, size = g.BLOCK[t]
    raw = bytearray(rng.integers(0, 256, size=count * size, dtype=np.uint8).tobytes())
    for b in range(count):
        for off in F16_FIELDS[t]:
            _, h = f16(rng.uniform(-2, 2) * 2.0 ** rng.integers(-12, 4))
            raw[b * size + off:b * size + off + 2] = h
        if t == g.MXFP4:  # the smallest scales (subnormal floats) too
            raw[b * size] = [0, 1, 127][b] if b < 3 else int(rng.integers(100, 150))
    return bytes(raw)


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    w = g.GGUFWriter()
    for t in sorted(DEQ):
        per, size = g.BLOCK[t]
        name = g.TYPE_NAMES[t]
        rows = 3
        x = rng.normal(size=(rows, 2 * per)) * np.array([[0.01], [1.0], [30.0]])
        x[0, :7] += 0.5                       # an outlier, a lopsided block
        data = quantize(t, x)
        y = dequantize(t, data)
        err = np.max(np.abs(y - x.reshape(-1)) / np.max(np.abs(x), axis=1).repeat(2 * per))
        bound = {g.Q8_0: 0.01, g.Q6_K: 0.05, g.Q5_0: 0.05, g.Q5_1: 0.05, g.Q5_K: 0.1}
        if err > bound.get(t, 0.2):
            sys.exit("%s: quantize/dequantize error %.3g too large" % (name, err))
        blocks = random_blocks(rng, t, 4)
        for suffix, raw, dims in [("quantized", data, [2 * per, rows]),
                                  ("random", blocks, [per, 4])]:
            w.add_tensor("%s.%s" % (name, suffix), t, dims, raw)
            w.add_tensor("%s.%s.expected" % (name, suffix), g.F64, dims,
                         dequantize(t, raw).astype("<f8").tobytes())
    w.write(out)


if __name__ == "__main__":
    main()

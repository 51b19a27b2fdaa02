#!/usr/bin/python3
"""An independent reference of the SentencePiece-style GGUF tokenizer
(tokenizer.ggml.model "llama"), standard library only, for
tests/engine/tokenizer_spm_test.cc.

Written from the published algorithm (llama.cpp's llm_tokenizer_spm and
SentencePiece's BPE), deliberately in a different shape from the C++ one
(services/engine/tokenizer_spm.cc): no heap, the whole symbol list is
rescanned for the best pair after every merge.

  encode: special tokens (control, unknown, user-defined), longest first,
    are cut out of the text first and never split; in each stretch of text
    between them a space becomes U+2581, and U+2581 is put before the text
    when add_space_prefix and the stretch starts the input; the stretch is cut
    into UTF-8 characters (a byte that starts no valid character is one of
    its own); then, while some adjacent pair concatenates to a vocabulary
    piece, the pair whose piece has the highest score is merged (leftmost
    among equal scores); a final symbol that is no piece becomes its
    "<0xNN>" byte tokens, or one unknown token when some byte has none.
    With add_special: bos first (add_bos), eos last (add_eos).
  decode: byte tokens are their byte, special and user-defined tokens their
    text, other pieces their text with U+2581 as a space; the very first
    piece loses one leading space when add_space_prefix.

Usage (the test's): spm_reference.py --gguf OUT.gguf --strings IN --out OUT
  [--no-space-prefix] [--add-eos]
writes the test vocabulary as a GGUF file and, for each line of IN (the
text as hex), one line of OUT: "<ids>\\t<ids with add_special>\\t<hex of the
decode of the first>", ids separated by spaces.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as g  # noqa: E402

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def test_vocabulary():
    """(text, score, type) per id: <unk> <s> </s>, the 256 byte tokens,
    single characters, then merged pieces with hand-picked scores (two
    deliberate ties: "ab"/"bc" and the runs of spaces)."""
    v = [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)]
    v += [("<0x%02X>" % b, 0.0, BYTE) for b in range(256)]
    chars = ([SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)] +
             [chr(c) for c in range(ord("A"), ord("Z") + 1)] +
             list("0123456789.,!?'-:;()") + ["\u00e9", "\u4e2d"])
    v += [(c, -100.0 - k, NORMAL) for k, c in enumerate(chars)]
    merged = [
        ("he", -2.0), ("\u2581he", -1.8), ("ll", -3.0), ("llo", -4.0), ("hell", -2.5),
        ("hello", -1.5), ("\u2581hello", -1.2), ("\u2581h", -6.0),
        ("\u2581w", -5.0), ("or", -2.2), ("ld", -3.1), ("\u2581wor", -2.8),
        ("\u2581world", -1.1), ("\u2581t", -1.0), ("\u2581the", -0.5),
        ("\u2581\u2581", -4.0), ("\u2581\u2581\u2581\u2581", -4.5),
        ("ab", -7.0), ("bc", -7.0), ("xy", -8.0), ("yz", -6.0),
        ("\u2581a", -3.3), ("an", -3.4), ("nd", -3.6), ("\u2581and", -2.9),
        ("in", -2.0), ("ing", -2.1), ("\u2581in", -2.4), ("er", -2.6),
        ("on", -2.7), ("\u2581on", -3.05), ("at", -3.15), ("\u2581c", -4.0),
        ("af", -5.0), ("af\u00e9", -4.9), ("\u2581caf\u00e9", -3.0),
        ("\u2581\u4e2d", -5.5), (".\u2581", -9.0), ("\u2581.", -9.5),
    ]
    v += [(t, s, NORMAL) for t, s in merged]
    v += [("[INST]", 0.0, CONTROL), ("<|tool|>", 0.0, USER_DEFINED), ("<unused0>", 0.0, UNUSED)]
    return v


def write_gguf(path, vocab, add_space_prefix=True, add_eos=False):
    w = g.GGUFWriter()
    w.add("general.architecture", g.STRING, "llama")
    w.add("tokenizer.ggml.model", g.STRING, "llama")
    w.add("tokenizer.ggml.tokens", g.ARRAY, [t for t, _, _ in vocab], elem=g.STRING)
    w.add("tokenizer.ggml.scores", g.ARRAY, [s for _, s, _ in vocab], elem=g.FLOAT32)
    w.add("tokenizer.ggml.token_type", g.ARRAY, [k for _, _, k in vocab], elem=g.INT32)
    w.add("tokenizer.ggml.bos_token_id", g.UINT32, 1)
    w.add("tokenizer.ggml.eos_token_id", g.UINT32, 2)
    w.add("tokenizer.ggml.unknown_token_id", g.UINT32, 0)
    w.add("tokenizer.ggml.padding_token_id", g.UINT32, 0)
    w.add("tokenizer.ggml.add_bos_token", g.BOOL, 1)
    w.add("tokenizer.ggml.add_eos_token", g.BOOL, 1 if add_eos else 0)
    w.add("tokenizer.ggml.add_space_prefix", g.BOOL, 1 if add_space_prefix else 0)
    w.write(path)


class SpmReference:
    def __init__(self, vocab, add_space_prefix=True, add_bos=True, add_eos=False,
                 bos=1, eos=2, unk=0):
        # Scores as the file holds them (FLOAT32), so that ties are the same.
        self.vocab = [(t, struct.unpack("<f", struct.pack("<f", s))[0], k) for t, s, k in vocab]
        self.add_space_prefix, self.add_bos, self.add_eos = add_space_prefix, add_bos, add_eos
        self.bos, self.eos, self.unk = bos, eos, unk
        self.piece_id = {}
        for i, (t, _, _) in enumerate(vocab):
            self.piece_id.setdefault(t.encode("utf-8"), i)
        self.specials = sorted(
            ((t.encode("utf-8"), i) for i, (t, _, k) in enumerate(vocab)
             if k in (UNKNOWN, CONTROL, USER_DEFINED) and t),
            key=lambda x: -len(x[0]))

    def _special_at(self, data, pos):
        for text, i in self.specials:  # longest first
            if data.startswith(text, pos):
                return text, i
        return None

    @staticmethod
    def _characters(data):
        # surrogateescape turns each byte of an invalid sequence into one
        # character of its own, and Python's decoder is strict (no overlong
        # forms, surrogates or values above U+10FFFF).
        return [c.encode("utf-8", "surrogateescape")
                for c in data.decode("utf-8", "surrogateescape")]

    def _encode_text(self, data, first):
        if not data:  # no prefix for nothing (llama.cpp: no fragment at all)
            return []
        text = data.replace(b" ", SPACE.encode("utf-8"))
        if self.add_space_prefix and first:
            text = SPACE.encode("utf-8") + text
        symbols = self._characters(text)
        while True:
            best, best_score = None, None
            for k in range(len(symbols) - 1):
                i = self.piece_id.get(symbols[k] + symbols[k + 1])
                if i is not None and (best is None or self.vocab[i][1] > best_score):
                    best, best_score = k, self.vocab[i][1]
            if best is None:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        out = []
        for s in symbols:
            if s in self.piece_id:
                out.append(self.piece_id[s])
                continue
            byte_ids = [self.piece_id.get(("<0x%02X>" % b).encode()) for b in s]
            if all(i is not None for i in byte_ids):
                out += byte_ids
            elif self.unk is not None:
                out.append(self.unk)
        return out

    def encode(self, data, add_special=False):
        out, start, pos = [], 0, 0
        while pos < len(data):
            m = self._special_at(data, pos)
            if m is None:
                pos += 1
                continue
            out += self._encode_text(data[start:pos], start == 0)
            out.append(m[1])
            pos += len(m[0])
            start = pos
        out += self._encode_text(data[start:], start == 0)
        if add_special:
            out = ([self.bos] if self.add_bos else []) + out + ([self.eos] if self.add_eos else [])
        return out

    def decode(self, ids):
        out = b""
        for n, i in enumerate(ids):
            text, _, kind = self.vocab[i]
            if kind in (UNKNOWN, CONTROL, USER_DEFINED):
                out += text.encode("utf-8")
            elif (len(text) == 6 and text.startswith("<0x") and text.endswith(">") and
                  all(c in "0123456789ABCDEF" for c in text[3:5])):
                out += bytes([int(text[3:5], 16)])
            else:
                piece = text.replace(SPACE, " ")
                if n == 0 and self.add_space_prefix and piece.startswith(" "):
                    piece = piece[1:]
                out += piece.encode("utf-8")
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--strings", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-space-prefix", action="store_true")
    ap.add_argument("--add-eos", action="store_true")
    a = ap.parse_args()
    vocab = test_vocabulary()
    write_gguf(a.gguf, vocab, add_space_prefix=not a.no_space_prefix, add_eos=a.add_eos)
    ref = SpmReference(vocab, add_space_prefix=not a.no_space_prefix, add_eos=a.add_eos)
    with open(a.strings) as f, open(a.out, "w") as out:
        for line in f.read().split("\n")[:-1]:
            data = bytes.fromhex(line)
            plain = ref.encode(data)
            special = ref.encode(data, add_special=True)
            out.write("%s\t%s\t%s\n" % (" ".join(map(str, plain)), " ".join(map(str, special)),
                                        ref.decode(plain).hex()))


if __name__ == "__main__":
    main()

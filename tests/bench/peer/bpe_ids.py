#!/usr/bin/python3
"""Token ids of a text under a byte-level BPE tokenizer.json (GPT-2 style:
ByteLevel pre-tokenizer with GPT-2's split pattern, ranked merges), as the
trained model's tokenizer (deploy/models/kjv-moe) is. A benchmark tool for
tests/bench/peer/gguf_agreement.sh, written from the published algorithm;
our engine has its own C++ tokenizer.

usage: bpe_ids.py TOKENIZER_JSON TEXT_FILE  -> a JSON list of ids on stdout
"""
import json
import re
import sys

# GPT-2's pattern with Python's classes: letters [^\W\d_], numbers \d, and
# "neither space, letter nor number" (underscore included).
SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def byte_alphabet():
    """GPT-2's byte -> printable character table."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def encode(tok, text):
    model = tok["model"]
    if model.get("type") != "BPE":
        sys.exit(f"bpe_ids: not a BPE tokenizer ({model.get('type')})")
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    rank = {m: i for i, m in enumerate(merges)}
    alphabet = byte_alphabet()
    cache, out = {}, []
    for word in SPLIT.findall(text):
        if word not in cache:
            parts = [alphabet[b] for b in word.encode("utf-8")]
            while len(parts) > 1:
                best = min(range(len(parts) - 1),
                           key=lambda i: rank.get((parts[i], parts[i + 1]), len(rank)))
                if (parts[best], parts[best + 1]) not in rank:
                    break
                parts[best:best + 2] = [parts[best] + parts[best + 1]]
            cache[word] = [vocab[p] for p in parts]
        out.extend(cache[word])
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    tok = json.load(open(sys.argv[1], encoding="utf-8"))
    text = open(sys.argv[2], encoding="utf-8").read()
    json.dump(encode(tok, text), sys.stdout)
    print()


if __name__ == "__main__":
    main()

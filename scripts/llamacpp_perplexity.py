#!/usr/bin/env python3
"""llama.cpp's perplexity of a text (via the PyPI package llama-cpp-python, the peer of issue 5),
computed exactly as `masskv perplexity` does: the whole file tokenized once (bos first where the
model adds one), chunks of CTX tokens evaluated alone with bos replacing each chunk's first
token, the second half of each chunk scored. Prints one markdown row and, with --json, writes it.

  python3 scripts/llamacpp_perplexity.py -m smollm2|gemma3|PATH -f policy.txt -c 512 --chunks 4
Needs `scripts/setup.sh --peer` (llama-cpp-python) and the models (`scripts/setup.sh --models`).
"""
import argparse
import json
import math
import sys
import time

import numpy as np

from llamacpp_reference import model_path


def log_softmax_at(logits, target):
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x[target] - m - math.log(np.exp(x - m).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2", help="smollm2, gemma3 or a GGUF path")
    ap.add_argument("-f", "--file", required=True, help="plain text file")
    ap.add_argument("-c", "--ctx-size", type=int, default=512, help="context per chunk")
    ap.add_argument("--chunks", type=int, default=0, help="chunks to evaluate (0: all)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="write the result as JSON to this file")
    a = ap.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("llama_cpp is not installed: scripts/setup.sh --peer")

    path = a.model if a.model not in ("smollm2", "gemma3") else model_path(a.model)
    llm = Llama(model_path=path, n_ctx=a.ctx_size, n_batch=a.ctx_size, logits_all=True,
                n_threads=a.threads, verbose=False, seed=0)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    text = open(a.file, "rb").read()
    toks = llm.tokenize(text, add_bos=add_bos, special=False)
    avail = len(toks) // a.ctx_size
    if avail == 0:
        sys.exit(f"{a.file}: {len(toks)} tokens, fewer than one context of {a.ctx_size}")
    n_chunks = min(a.chunks, avail) if a.chunks > 0 else avail
    first = a.ctx_size // 2
    nll, scored = 0.0, 0
    t0 = time.time()
    for c in range(n_chunks):
        chunk = list(toks[c * a.ctx_size:(c + 1) * a.ctx_size])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        for i in range(first, a.ctx_size):
            nll -= log_softmax_at(llm.scores[i - 1], chunk[i])
            scored += 1
        print(f"chunk {c + 1}/{n_chunks}: ppl so far {math.exp(nll / scored):.4f}",
              file=sys.stderr)
    ppl = math.exp(nll / scored)
    name = a.model if a.model in ("smollm2", "gemma3") else path
    print("| peer | model | ctx | chunks | scored | ppl |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    print(f"| llama.cpp | {name} | {a.ctx_size} | {n_chunks} | {scored} | {ppl:.4f} |")
    print(f"llama.cpp perplexity: {scored} tokens scored in {time.time() - t0:.1f} s",
          file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": "llama.cpp", "model": name, "ctx": a.ctx_size,
                       "chunks": n_chunks, "scored": scored, "ppl": ppl, "tokens": len(toks)},
                      f, indent=1)


if __name__ == "__main__":
    main()

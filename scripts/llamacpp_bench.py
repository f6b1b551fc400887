#!/usr/bin/env python3
"""The llama.cpp side of `masskv bench --peer llama.cpp`: the same tests on the same GGUF file.

llama.cpp runs through the PyPI package llama-cpp-python (scripts/setup.sh --peer builds it).
As llama-bench: random token ids, the depth is evaluated untimed first, then each test is
repeated on top of it (the KV cache is cut back to the depth between repetitions). Prints one
JSON object per test on stdout:
  {"test": "pp512", "depth": 0, "threads": 1, "tokens": 512, "seconds": [...]}

  python3 scripts/llamacpp_bench.py MODEL.gguf -p 512 -n 128 -d 0,2048 -t 1 -r 3
"""
import argparse
import json
import sys
import time

try:
    import numpy as np
    from llama_cpp import Llama
except ImportError as e:  # the caller reports this line to the user
    sys.exit(f"llama-cpp-python is not installed ({e}): run scripts/setup.sh --peer")


def ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (0: none)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (0: none)")
    ap.add_argument("-d", type=ints, default=[0], help="depths, comma-separated")
    ap.add_argument("-t", type=ints, default=[1], help="thread counts, comma-separated")
    ap.add_argument("-r", type=int, default=3, help="repetitions")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    longest = max(a.p, a.n)
    for threads in a.t:
        llm = Llama(model_path=a.model, n_ctx=max(a.d) + longest + 8, n_batch=512,
                    n_threads=threads, n_threads_batch=threads, verbose=False, seed=a.seed)
        vocab = llm.n_vocab()
        for depth in a.d:
            llm.reset()
            if depth > 0:
                llm.eval(rng.integers(0, vocab, depth).tolist())
            tests = [("pp", a.p), ("tg", a.n)]
            for kind, count in tests:
                if count <= 0:
                    continue
                toks = rng.integers(0, vocab, count).tolist()
                # Warm-up, as llama-bench: one short run that is not timed.
                llm.n_tokens = depth
                llm.eval(toks[: min(count, 16)] if kind == "pp" else toks[:1])
                secs = []
                for _ in range(a.r):
                    llm.n_tokens = depth  # eval() first drops the cache past n_tokens
                    t0 = time.perf_counter()
                    if kind == "pp":
                        llm.eval(toks)
                    else:
                        for tok in toks:
                            llm.eval([tok])
                    secs.append(time.perf_counter() - t0)
                print(json.dumps({"test": f"{kind}{count}", "depth": depth, "threads": threads,
                                  "tokens": count, "seconds": secs}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Paired comparison of eval methods from `masskv eval`'s results.json records (issue 30's
quality rule): per protocol and budget, over the (task, length) cells where dense scores at
least --min-dense, the mean paired difference (method - reference) on the same samples, and a
95% bootstrap interval (samples resampled with replacement, --boot draws, fixed seed).

The reference is the weaker of dense and the oracle by pooled mean (the oracle can fall below
dense), unless --against names one.

    scripts/paired.py out/eval/results.json --method two_stage
    scripts/paired.py docs/results/eval-needles-smollm2/results.json --method quest --against dense
    scripts/paired.py out/eval/results.json --method learned_codes --against token_codes
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from collections import defaultdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("results", nargs="+",
                    help="results.json files of masskv eval (or results.json.gz: the large ones "
                         "are committed gzipped, docs/eval.md)")
    ap.add_argument("--method", required=True, help="the method to judge (e.g. two_stage)")
    ap.add_argument("--against", default="",
                    help="dense, oracle or any other method at the same budget (default: the "
                         "weaker of dense and the oracle)")
    ap.add_argument("--against-budget", default="",
                    help="the reference's budget (default: the method's), e.g. judge a top-p "
                         "budget against the fixed one: --method token_codes --against token_codes "
                         "--against-budget 1/16")
    ap.add_argument("--min-dense", type=float, default=0.2, help="cells where dense scores >= this")
    ap.add_argument("--boot", type=int, default=10000, help="bootstrap draws")
    a = ap.parse_args()
    recs = []
    for path in a.results:
        try:
            with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
                recs += json.load(f)["records"]
        except (OSError, KeyError, json.JSONDecodeError, EOFError) as e:
            ap.error(f"{path}: {e}")
    # score[(protocol, budget-of-method, method)][(task, length, index)]
    by, kv = defaultdict(dict), defaultdict(dict)   # kv: the KV share each row read
    for r in recs:
        proto = r.get("protocol", "strict")
        key = (r["task"], r["length"], r["index"])
        by[(proto, r["method"], r["budget"])][key] = r["score"]
        kv[(proto, r["method"], r["budget"])][key] = r.get("kv_read", float("nan"))
    protocols = sorted({k[0] for k in by})
    rows = []
    for proto in protocols:
        dense = by.get((proto, "dense", "-"), {})
        cells = defaultdict(list)
        for k, s in dense.items():
            cells[(k[0], k[1])].append(s)
        good = {c for c, v in cells.items() if sum(v) / len(v) >= a.min_dense}
        budgets = sorted({k[2] for k in by if k[0] == proto and k[1] == a.method})
        for b in budgets:
            m = by[(proto, a.method, b)]
            rb = a.against_budget or b
            if a.against_budget and a.against == a.method and b == rb:
                continue  # the reference itself
            orc = by.get((proto, "oracle", rb), {})
            keys = [k for k in m if (k[0], k[1]) in good and k in dense]
            refs = {"dense": dense, "oracle": orc}
            if a.against:
                ref_name = a.against
                if ref_name not in refs:
                    refs[ref_name] = by.get((proto, ref_name, rb), {})
            else:
                keys_o = [k for k in keys if k in orc]
                mean = lambda d, ks: sum(d[k] for k in ks) / max(1, len(ks))
                ref_name = "oracle" if keys_o and mean(orc, keys_o) < mean(dense, keys_o) else "dense"
            ref = refs[ref_name]
            keys = [k for k in keys if k in ref]
            if not keys:
                continue
            diffs = [m[k] - ref[k] for k in keys]
            point = sum(diffs) / len(diffs)
            rng = random.Random(1)
            boots = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(a.boot))
            lo, hi = boots[int(0.025 * a.boot)], boots[int(0.975 * a.boot) - 1]
            ref_kv = kv[(proto, ref_name, "-" if ref_name == "dense" else rb)]
            kv_m = sum(kv[(proto, a.method, b)][k] for k in keys) / len(keys)
            kv_r = sum(ref_kv.get(k, float("nan")) for k in keys) / len(keys)
            rows.append((proto, b, f"{ref_name} {rb}" if a.against_budget else ref_name, len(keys),
                         100 * sum(m[k] for k in keys) / len(keys),
                         100 * sum(ref[k] for k in keys) / len(keys), 100 * point, 100 * lo,
                         100 * hi, 100 * kv_m, 100 * kv_r))
    print(f"| protocol | budget | reference | n | {a.method} % | reference % | paired diff (points) "
          "| 95% bootstrap | KV read % (method / reference) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for p, b, ref, n, mm, rm, d, lo, hi, km, kr in rows:
        print(f"| {p} | {b} | {ref} | {n} | {mm:.1f} | {rm:.1f} | {d:+.1f} | [{lo:+.1f}, {hi:+.1f}] "
              f"| {km:.1f} / {kr:.1f} |")
    if not rows:
        print(f"paired.py: no records of {a.method}"
              + (f" beside {a.against}" if a.against else "")
              + f" in cells where dense >= {a.min_dense}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

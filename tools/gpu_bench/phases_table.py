#!/usr/bin/env python3
"""Side-by-side table of two `masskv_gpu_bench profile-phases` logs (before / after a change).

For every step and context in both logs: the span from the step's first stamp to its last
(µs, the medians the log prints), the event-timed graph, and per kernel the latest CTA's exit
(or, for kernels without an exit stamp, their latest phase). Markdown on stdout.

    python3 tools/gpu_bench/phases_table.py before/phases.log after/phases.log
"""
import argparse
import re
import sys

STEP = re.compile(r"phases (.+?)\s+ctx=\s*(\d+)\s+graph\s+([\d.]+) us \(events\), "
                  r"first to last stamp\s+([\d.]+) us")
KERNEL = re.compile(r"\s+(\w+)\s+(\d+) CTAs:(.*)")
PHASE = re.compile(r"\s+([a-z0-9 ]+?) ([\d.]+)-([\d.]+)")


def context_name(tokens):
    return f"{tokens // 1048576}M" if tokens >= 1048576 else f"{tokens // 1024}K"


def parse(path):
    """{(step, context): {"graph": µs, "span": µs, "kernels": {name: latest µs}}} in log order."""
    steps, cur = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = STEP.match(line)
            if m:
                cur = {"graph": float(m.group(3)), "span": float(m.group(4)), "kernels": {}}
                steps[(m.group(1).strip(), int(m.group(2)))] = cur
                continue
            m = KERNEL.match(line)
            if m and cur is not None:
                phases = PHASE.findall(m.group(3))
                if phases:
                    exits = [float(hi) for name, _, hi in phases if name == "exit"]
                    cur["kernels"][m.group(1)] = exits[0] if exits else float(phases[-1][2])
    return steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="profile-phases log before the change")
    ap.add_argument("after", help="profile-phases log after the change")
    ap.add_argument("--kernels", action="store_true",
                    help="also a row per kernel: its latest exit, µs after the step's first stamp")
    args = ap.parse_args(argv)
    try:
        a, b = parse(args.before), parse(args.after)
    except OSError as e:
        print(f"phases_table: {e}", file=sys.stderr)
        return 2
    common = [k for k in a if k in b]
    if not common:
        print("phases_table: the logs share no step (are both profile-phases output?)",
              file=sys.stderr)
        return 2
    print("| step | context | first→last stamp µs, before | after | graph µs (events), before "
          "| after |")
    print("|---|---|---:|---:|---:|---:|")
    for k in common:
        x, y = a[k], b[k]
        print(f"| {k[0]} | {context_name(k[1])} | {x['span']:.1f} | {y['span']:.1f} | "
              f"{x['graph']:.1f} | {y['graph']:.1f} |")
        if args.kernels:
            for name in x["kernels"]:
                if name in y["kernels"]:
                    print(f"| &nbsp;&nbsp;{name} (latest exit) | | {x['kernels'][name]:.1f} | "
                          f"{y['kernels'][name]:.1f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

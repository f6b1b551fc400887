"""Joins masskv_gpu_bench prefill-bench's JSON and torch_peer.py's prefill rows into one markdown
table + one JSON: µs, TFLOP/s (ours: FLOPs of the computed 64x64 tiles; torch: 4·d·Hq·L²/2),
speedup vs torch SDPA cuDNN causal (its faster spelling, gqa or expand) at the same L.
Usage: python3 prefill_report.py prefill.json torch.json OUT.md OUT.json"""
import json
import sys


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))

    def best(prefix):  # fastest spelling of a backend per context
        out = {}
        for r in peer["rows"]:
            if r["kind"].startswith(prefix) and r.get("us"):
                out[r["ctx"]] = min(out.get(r["ctx"], r["us"]), r["us"])
        return out

    cudnn, flash = best("torch_prefill_cudnn"), best("torch_prefill_flash")
    lines = [f"Device: {ours['device']} ({ours['sms']} SMs); torch {peer['torch']}. Prefill, B=1, "
             "Hq=32, Hkv=8, d=128, bf16, causal; sparse budget = L/16 keys per query block "
             "(>= 2048), sink block and diagonal included.", "",
             "| row | L | budget (tokens) | µs | TFLOP/s | cuDNN µs | flash µs | speedup vs cuDNN |",
             "|---|---|---|---|---|---|---|---|"]
    table = []
    for ctx in sorted({r["ctx"] for r in ours["rows"]}):
        c, f = cudnn.get(ctx), flash.get(ctx)
        flops_peer = 4.0 * 128 * 32 * ctx * ctx / 2
        for name, us in (("torch_sdpa_cudnn_causal", c), ("torch_sdpa_flash_causal", f)):
            if us:
                lines.append(f"| {name} | {ctx // 1024}K | - | {us:.1f} | "
                             f"{flops_peer / us / 1e6:.0f} | | | {c / us:.2f}x |")
        for r in ours["rows"]:
            if r["ctx"] != ctx:
                continue
            tf = r["flops"] / r["us"] / 1e6 if r["flops"] else None
            # Speedups beside attention rows only (the indexer alone is not attention).
            sp = c / r["us"] if c and r["kind"].startswith("prefill_ours") else None
            table.append(dict(r, tflops=tf, cudnn_us=c, flash_us=f, speedup_vs_cudnn=sp))
            fmt = lambda x, spec: format(x, spec) if x else "-"
            lines.append(f"| {r['kind']} | {ctx // 1024}K | {r['budget'] or '-'} | {r['us']:.1f} | "
                         f"{fmt(tf, '.0f')} | {fmt(c, '.1f')} | {fmt(f, '.1f')} | "
                         f"{fmt(sp, '.2f')}{'x' if sp else ''} |")
    open(sys.argv[3], "w").write("\n".join(lines) + "\n")
    json.dump({"ours": ours, "torch": peer, "table": table}, open(sys.argv[4], "w"), indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The latency-floor table (issue 33's format) from one bench run: masskv_gpu_bench's JSON
(bench, prefill-bench) and torch_peer.py's, all measured in the same call on the same card.

Every ratio is cuDNN µs / ours at the same shape (B, Hq 32, Hkv 8, d 128, bf16, page 16). The
floor of a fresh sparse step is what its bytes, one launch and its serial device-wide stages
cost at the run's own measurements (docs/gpu.md, "The floor of a fresh sparse step"):

    floor = bytes / read ceiling + one launch + stages x device-wide round trip

with the read ceiling the bench's `ceiling_read` (bytes / µs of a read-only kernel over 4 GiB),
one launch `floor_graph_1` (one empty kernel in a CUDA graph) and the round trip
(`floor_graph_4` - `floor_graph_1`) / 3 (each further dependent kernel). `stages` counts the
exchanges the selection rule needs across the whole device, whatever the kernels: flat Quest 2
(the pages chosen; the split-K partials merged), hierarchical 3 (the groups chosen too).

Usage: python3 floor_report.py OURS.json TORCH.json PREFILL.json OUT.md OUT.json [--command C]
"""
import argparse
import json

STAGES = {"quest": 2, "quest_hier": 3}
SPARSE_KINDS = {"quest_hier": "ours_sparse_hier_gpu_sel_layers_graph",
                "quest": "ours_sparse_quest_gpu_sel_layers_graph"}
# issue 33's targets: (name, ctx, batch) -> minimum cuDNN / ours (entmax: maximum entmax /
# softmax; floor share: ours floor / ours at least this).
TARGETS = {("sparse_step", 32768, 1): 2.5, ("sparse_step", 131072, 1): 8.0,
           ("sparse_step", 1048576, 1): 50.0, ("sparse_step", 131072, 16): 25.0,
           ("dense_decode", 32768, 1): 1.0, ("dense_decode", 131072, 1): 1.0,
           ("dense_decode", 1048576, 1): 0.98, ("dense_prefill", 32768, 1): 1.0,
           ("dense_prefill", 131072, 1): 1.0, ("sparse_prefill", 131072, 1): 7.0}
FLOOR_SHARE = 0.75
ENTMAX_MAX = 1.2


def by_shape(rows, kind, budget=None):
    """{(ctx, batch): row} of one kind (and budget)."""
    return {(r["ctx"], r["batch"]): r for r in rows
            if r["kind"] == kind and (budget is None or r.get("budget") == budget)}


def fastest(rows, kinds):
    """{(ctx, batch): µs} of the fastest of several spellings of one peer."""
    out = {}
    for r in rows:
        if r["kind"] in kinds and r.get("us"):
            key = (r["ctx"], r["batch"])
            out[key] = min(out.get(key, r["us"]), r["us"])
    return out


def one(rows, kind):
    for r in rows:
        if r["kind"] == kind:
            return r
    raise SystemExit(f"floor_report: the bench JSON has no {kind!r} row (a full bench run "
                     "writes it)")


def floor_terms(ours_rows):
    """Read ceiling (bytes per µs), one launch (µs), the device-wide round trip (µs)."""
    ceiling = one(ours_rows, "ceiling_read")
    launch = one(ours_rows, "floor_graph_1")["us"]
    four = one(ours_rows, "floor_graph_4")["us"]
    return ceiling["bytes"] / ceiling["us"], launch, max(0.0, (four - launch) / 3)


def build(ours, peer, prefill, budget=4096):
    rows = []
    # The shape: Hq 32 (the bench also times Hq 64 rows; they are left out here).
    ours = dict(ours, rows=[r for r in ours["rows"] if r.get("hq", 32) == 32])
    peer = dict(peer, rows=[r for r in peer["rows"] if r.get("hq", 32) == 32])
    read, launch, trip = floor_terms(ours["rows"])
    decode_peer = fastest(peer["rows"], {"torch_cudnn_gqa", "torch_cudnn_rows"})
    layers_peer = fastest(peer["rows"], {"torch_layers_cudnn_gqa", "torch_layers_cudnn_rows"})
    for scorer, kind in SPARSE_KINDS.items():
        for (ctx, batch), r in sorted(by_shape(ours["rows"], kind, budget).items()):
            cudnn = layers_peer.get((ctx, batch), decode_peer.get((ctx, batch)))
            floor = r["bytes"] / read + launch + STAGES[scorer] * trip
            rows.append(dict(name="sparse_step", ctx=ctx, batch=batch, scorer=scorer,
                             budget=budget, ours_us=r["us"], cudnn_us=cudnn, bytes=r["bytes"]))
            rows.append(dict(name="floor", ctx=ctx, batch=batch, scorer=scorer, budget=budget,
                             ours_us=floor, cudnn_us=cudnn, bytes=r["bytes"],
                             stages=STAGES[scorer], read_bytes_per_us=read, launch_us=launch,
                             round_trip_us=trip, step_us=r["us"]))
    for (ctx, batch), r in sorted(by_shape(ours["rows"], "ours_dense_graph").items()):
        rows.append(dict(name="dense_decode", ctx=ctx, batch=batch, scorer=None,
                         ours_us=r["us"], cudnn_us=decode_peer.get((ctx, batch))))
    for r in ours["rows"]:
        if r["kind"] != "ours_entmax_sparse_quest_cpu_sel_graph":
            continue
        s = next((x for x in ours["rows"] if x["kind"] == "ours_sparse_quest_cpu_sel_graph"
                  and (x["ctx"], x["batch"], x["budget"]) == (r["ctx"], r["batch"],
                                                              r["budget"])), None)
        rows.append(dict(name="entmax_sparse", ctx=r["ctx"], batch=r["batch"], scorer="quest",
                         budget=r["budget"], ours_us=r["us"],
                         cudnn_us=decode_peer.get((r["ctx"], r["batch"])),
                         softmax_us=None if s is None else s["us"]))
    if prefill is not None:
        pre_peer = fastest(peer["rows"], {"torch_prefill_cudnn_gqa", "torch_prefill_cudnn_expand"})
        for r in prefill["rows"]:
            name = {"prefill_ours_dense": "dense_prefill",
                    "prefill_ours_sparse_with_index": "sparse_prefill"}.get(r["kind"])
            if name:
                rows.append(dict(name=name, ctx=r["ctx"], batch=r["batch"], scorer=(
                    "block_index" if name == "sparse_prefill" else None),
                    budget=r.get("budget") or None, ours_us=r["us"],
                    cudnn_us=pre_peer.get((r["ctx"], r["batch"]))))
    for r in rows:
        r["speedup"] = (r["cudnn_us"] / r["ours_us"]) if r.get("cudnn_us") else None
        if r["name"] == "entmax_sparse" and r.get("softmax_us"):
            r["entmax_over_softmax"] = r["ours_us"] / r["softmax_us"]
        if r["name"] == "floor":
            r["share_of_floor"] = r["ours_us"] / r["step_us"]
    return rows


def verdict(r):
    """The issue's target for this row, and met / missed by how much."""
    if r["name"] == "entmax_sparse":
        x = r.get("entmax_over_softmax")
        if x is None or not 2048 <= r.get("budget", 0) <= 8192:
            return "-"
        return f"≤ {ENTMAX_MAX}: {'met' if x <= ENTMAX_MAX else f'missed by {x - ENTMAX_MAX:.2f}'}"
    if r["name"] == "floor":
        s = r["share_of_floor"]
        return (f"floor / step ≥ {FLOOR_SHARE:.0%}: "
                + ("met" if s >= FLOOR_SHARE else f"missed ({s:.0%})"))
    want = TARGETS.get((r["name"], r["ctx"], r["batch"]))
    if want is None or r["speedup"] is None or (r["name"] == "sparse_step"
                                                and r["scorer"] != "quest_hier"):
        return "-"
    return f"≥ {want}×: " + ("met" if r["speedup"] >= want else
                             f"missed ({r['speedup']:.2f}×, {r['speedup'] / want:.0%} of it)")


def markdown(card, rows, command):
    out = [f"# Latency floor: masskv against cuDNN on one card ({card})", "",
           "All rows from one run (`scripts/gpu.sh`), cuDNN SDPA measured in the same call. "
           "B, Hq 32, Hkv 8, d 128, bf16, page 16; sparse steps fresh (selection every step), "
           "µs per layer inside a captured graph of several layers; × = cuDNN µs / ours. The "
           "floor: bytes / read ceiling + one launch + stages × device-wide round trip "
           "(tools/gpu_bench/floor_report.py).", ""]
    if command:
        out += [f"`{command}`", ""]
    f = next((r for r in rows if r["name"] == "floor"), None)
    if f:
        out += [f"Measured in the run: read ceiling {f['read_bytes_per_us'] / 1e6:.2f} TB/s, one "
                f"launch {f['launch_us']:.1f} µs, device-wide round trip "
                f"{f['round_trip_us']:.2f} µs.", ""]
    out += ["| row | scorer | ctx | B | budget | ours µs | cuDNN µs | × | target |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        extra = ""
        if r["name"] == "floor":
            extra = f" (step {r['step_us']:.1f}: floor / step {r['share_of_floor']:.0%})"
        if r["name"] == "entmax_sparse" and r.get("softmax_us"):
            extra = f" (softmax {r['softmax_us']:.1f}: {r['entmax_over_softmax']:.2f}×)"
        cud = "-" if r.get("cudnn_us") is None else f"{r['cudnn_us']:.1f}"
        sp = "-" if r.get("speedup") is None else f"{r['speedup']:.2f}"
        out.append(f"| {r['name']} | {r.get('scorer') or '-'} | {r['ctx']} | {r['batch']} | "
                   f"{r.get('budget') or '-'} | {r['ours_us']:.1f}{extra} | {cud} | {sp} | "
                   f"{verdict(r)} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ours")
    ap.add_argument("torch")
    ap.add_argument("prefill", help="prefill-bench's JSON ('-': none)")
    ap.add_argument("out_md")
    ap.add_argument("out_json")
    ap.add_argument("--command", default="", help="the command that made the inputs")
    ap.add_argument("--budget", type=int, default=4096)
    a = ap.parse_args()
    ours = json.load(open(a.ours))
    peer = json.load(open(a.torch))
    prefill = None if a.prefill == "-" else json.load(open(a.prefill))
    if ours.get("device") and peer.get("device") and ours["device"] != peer["device"]:
        raise SystemExit(f"floor_report: ours ran on {ours['device']}, torch on "
                         f"{peer['device']}: ratios need one card")
    rows = build(ours, peer, prefill, a.budget)
    card = ours.get("device", "unknown card")
    text = markdown(card, rows, a.command)
    open(a.out_md, "w").write(text)
    json.dump({"card": card, "command": a.command, "rows": rows}, open(a.out_json, "w"),
              indent=1)
    print(text)


if __name__ == "__main__":
    main()

"""Joins masskv_gpu_bench's and torch_peer.py's JSON into one markdown table + one JSON.
Usage: python3 report.py ours.json torch.json OUT.md OUT.json"""
import json
import sys


SPARSE_COLS = [
    ("ours_sparse_quest_cpu_sel", "decode, CPU sel µs"),
    ("ours_sparse_quest_cpu_sel_graph", "graph µs"),
    ("ours_sparse_quest_gpu_sel", "GPU sel + decode µs"),
    ("ours_sparse_quest_gpu_sel_graph", "graph µs"),
    ("ours_step_append_select_decode_graph", "append + select + decode graph µs"),
    ("gpu_quest_select", "GPU select µs"),
    ("gpu_quest_score", "GPU score µs"),
]


def captioned(caption, columns, lines):
    """A markdown table under a caption (nothing when there are no lines)."""
    if not lines:
        return []
    return ["", caption, "", "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns)] + lines


def rows_by_shape(rows):
    """Sparse rows keyed by (context, batch, q heads, budget), then by row kind."""
    by = {}
    for r in rows:
        if r["budget"]:
            by.setdefault((r["ctx"], r["batch"], r.get("hq", 32), r["budget"]), {})[r["kind"]] = r
    return by


def sparse_table(rows):
    """Sparse decode side by side: the CPU-selection rows time the decode alone (the CPU
    selection, in its own column, runs before and is not in their µs); the GPU-selection rows
    time selection + decode in one step."""
    by = rows_by_shape(rows)
    if not by:
        return []
    out = ["", "Sparse decode (Quest, sink page 1, budget in tokens): CPU selection (computed "
           "beforehand, not in the decode µs) vs GPU selection (in the step).", "",
           "| context | B | Hq | budget | CPU select ms | "
           + " | ".join(name for _, name in SPARSE_COLS) + " | GPU step vs CPU select + decode |",
           "|---|---|---|---|---|" + "---|" * len(SPARSE_COLS) + "---|"]
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        cells = [f"{k[kind]['us']:.1f}" if kind in k else "-" for kind, _ in SPARSE_COLS]
        cpu = k.get("ours_sparse_quest_cpu_sel")
        gpu = k.get("ours_sparse_quest_gpu_sel_graph") or k.get("ours_sparse_quest_gpu_sel")
        ms = cpu.get("cpu_select_ms", 0) if cpu else 0
        ratio = "-"
        if cpu and gpu and ms:
            ratio = f"{(cpu['us'] + 1e3 * ms) / gpu['us']:.1f}x"
        out.append(f"| {ctx // 1024}K | {batch} | {hq} | {budget} | {ms:.2f} | " + " | ".join(cells)
                   + f" | {ratio} |")
    return out


ENTMAX_PAIRS = [  # (softmax row, entmax row) timing the same step
    ("ours_dense", "ours_entmax_dense"),
    ("ours_dense_graph", "ours_entmax_dense_graph"),
    ("ours_sparse_quest_cpu_sel", "ours_entmax_sparse_quest_cpu_sel"),
    ("ours_sparse_quest_cpu_sel_graph", "ours_entmax_sparse_quest_cpu_sel_graph"),
]


def entmax_table(rows):
    """1.5-entmax against softmax on the same step (dense, or sparse on the same CPU Quest
    selection, decode only). Entmax rows count K bytes only: V is read at the support rows."""
    by = {}
    for r in rows:
        by.setdefault((r["ctx"], r["batch"], r.get("hq", 32), r["budget"]), {})[r["kind"]] = r
    lines = []
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        cells = []
        for soft, ent in ENTMAX_PAIRS:
            if soft in k and ent in k:
                cells.append(f"{k[soft]['us']:.1f} | {k[ent]['us']:.1f} | "
                             f"{k[ent]['us'] / k[soft]['us']:.2f}x")
        if len(cells) == 2:
            # The split-K entmax path forced on the same selection (sparse rows only).
            split_row = k.get("ours_entmax_sparse_split_quest_cpu_sel_graph")
            ent_row = k.get("ours_entmax_sparse_quest_cpu_sel_graph")
            soft_row = k.get("ours_sparse_quest_cpu_sel_graph")
            cells.append(f"{split_row['us']:.1f} | {split_row['us'] / soft_row['us']:.2f}x | "
                         f"{ent_row['us'] / split_row['us']:.2f}"
                         if split_row and ent_row and soft_row else "- | - | -")
            lines.append(f"| {ctx // 1024}K | {batch} | {hq} | {budget or 'dense'} | "
                         + " | ".join(cells) + " |")
    if not lines:
        return []
    return ["", "Entmax (alpha 1.5) vs softmax, same step: dense, or sparse on the same CPU "
            "selection (decode only). Sparse entmax is the automatic path (the one-kernel "
            "cluster decode where the clusters fit in one wave, else split-K); the last three "
            "columns force the split-K path on the same selection.", "",
            "| context | B | Hq | budget | softmax µs | entmax µs | entmax/softmax | softmax graph µs "
            "| entmax graph µs | entmax/softmax (graph) | split-K entmax graph µs "
            "| split-K / softmax (graph) | automatic / split-K |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + lines


def flex_table(ours_rows, peer_rows, cudnn):
    """FlexAttention with a block mask of the same bytes (random 128-token blocks per kv head)
    against our sparse decode on a given selection (decode only) and with the GPU selection
    in the step, all beside cuDNN's dense decode of the same context."""
    ours = {(r["ctx"], r["batch"], r["budget"], r["kind"]): r["us"] for r in ours_rows
            if r.get("hq", 32) == 32}
    lines = []
    for r in peer_rows:
        if r["kind"] != "torch_flex_sparse":
            continue
        key = (r["ctx"], r["batch"], r["budget"])
        flex = r.get("us")
        mine = ours.get(key + ("ours_sparse_quest_cpu_sel_graph",))
        step = ours.get(key + ("ours_sparse_quest_gpu_sel_graph",))
        dense = cudnn.get((r["ctx"], r["batch"], 32))
        f = lambda x: f"{x:.1f}" if x else "-"
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        lines.append(f"| {r['ctx'] // 1024}K | {r['budget']} | {f(flex)} | {f(mine)} | "
                     f"{ratio(flex, mine)} | {f(step)} | {ratio(flex, step)} | {f(dense)} | "
                     f"{ratio(dense, flex)} |"
                     + (f" failed: {r['error'][:80]} |" if r.get("error") else ""))
    if not lines:
        return []
    return ["", "FlexAttention (torch.compile, block mask of 128-token blocks, same bytes per kv "
            "head) vs ours (sparse decode on a given selection, CUDA graph; and the whole step "
            "with GPU Quest selection). Ratios > 1: ours faster.", "",
            "| context | budget | flex µs | ours decode µs | flex/ours | ours GPU-sel step µs "
            "| flex/step | cuDNN dense µs | flex speedup vs cuDNN |",
            "|---|---|---|---|---|---|---|---|---|"] + lines


COMPACT_COLS = [  # (row, header, what to print)
    ("gpu_quest_score", "bf16 score µs", "us"),
    ("gpu_quest_topk", "top-k µs", "us"),
    ("ours_sparse_quest_gpu_sel_graph", "bf16 step µs", "us"),
    ("gpu_quest8_score", "8-bit score µs", "us"),
    ("ours_sparse_quest8_gpu_sel_graph", "8-bit step µs", "us"),
    ("gpu_quest8_select", "8-bit recall", "recall"),
    ("gpu_hier_select", "hier select µs", "us"),
    ("ours_sparse_hier_gpu_sel_graph", "hier step µs", "us"),
    ("gpu_hier_select", "hier recall", "recall"),
    ("gpu_hier_select", "hier identical lists", "identical"),
    ("ours_sparse_hier_c4_gpu_sel_graph", "hier cover 4 step µs", "us"),
    ("gpu_hier_c4_select", "hier cover 4 recall", "recall"),
    ("ours_sparse_hier8_c4_gpu_sel_graph", "hier cover 4, 8-bit pages step µs", "us"),
]


def compact_table(rows, cudnn):
    """Selection by summary level (bf16 pages, 8-bit pages, bf16 groups of 16 then pages):
    selection and whole-step µs (CUDA graph), bytes each scan reads, recall of the flat bf16
    selection, and the step's speedup against cuDNN dense decode."""
    by = rows_by_shape(rows)
    lines = []
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        if "gpu_hier_select" not in k:
            continue
        cells = []
        for kind, _, field in COMPACT_COLS:
            v = k.get(kind, {}).get(field)
            cells.append("-" if v is None or v < 0 else
                         (f"{v:.1f}" if field == "us" else f"{v:.4f}"))
        mb = lambda kind: f"{k[kind]['bytes'] / 1e6:.1f}" if kind in k else "-"
        c = cudnn.get((ctx, batch, hq))
        speed = lambda kind: (f"{c / k[kind]['us']:.1f}x" if c and kind in k else "-")
        lines.append(
            f"| {ctx // 1024}K | {batch} | {hq} | {budget} | " + " | ".join(cells)
            + f" | {mb('gpu_quest_score')} / {mb('gpu_quest8_score')} / {mb('gpu_hier_select')}"
            + f" / {mb('gpu_hier_c4_select')} / {mb('gpu_hier8_c4_select')}"
            + f" | {speed('ours_sparse_quest_gpu_sel_graph')} / "
            + f"{speed('ours_sparse_quest8_gpu_sel_graph')} / "
            + f"{speed('ours_sparse_hier_gpu_sel_graph')} / "
            + f"{speed('ours_sparse_hier_c4_gpu_sel_graph')} / "
            + f"{speed('ours_sparse_hier8_c4_gpu_sel_graph')} |")
    if not lines:
        return []
    return ["", "GPU selection by summary level (step = select + sparse decode, one CUDA graph; "
            "recall of the flat bf16 selection's pages; hier: groups of 16 pages, cover 2 "
            "unless marked c4).", "",
            "| context | B | Hq | budget | " + " | ".join(h for _, h, _ in COMPACT_COLS)
            + " | summary MB bf16 / 8-bit / hier / hier c4 / hier8 c4 | step vs cuDNN bf16 / "
            "8-bit / hier / hier c4 / hier8 c4 |",
            "|---|---|---|---|" + "---|" * len(COMPACT_COLS) + "---|---|"] + lines


def fused_table(rows, cudnn):
    """hier_select as separate launches vs one fused kernel, same selection: selection and whole-step µs (CUDA graph),
    their ratio, the fraction of lists identical to the flat selection's, and the step's
    speedup against cuDNN dense decode."""
    by = rows_by_shape(rows)
    lines = []
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        for suffix, cover in (("", 2), ("_c4", 4)):
            sep_sel, fus_sel = k.get(f"gpu_hier{suffix}_select"), k.get(f"gpu_hier_fused{suffix}_select")
            sep, fus = (k.get(f"ours_sparse_hier{suffix}_gpu_sel_graph"),
                        k.get(f"ours_sparse_hier_fused{suffix}_gpu_sel_graph"))
            if not (sep_sel and fus_sel and sep and fus):
                continue
            c = cudnn.get((ctx, batch, hq))
            lines.append(
                f"| {ctx // 1024}K | {batch} | {hq} | {budget} | {cover} | {sep_sel['us']:.1f} | "
                f"{fus_sel['us']:.1f} | {sep['us']:.1f} | {fus['us']:.1f} | "
                f"{fus['us'] / sep['us']:.2f} | {sep_sel['identical']:.3f} / "
                f"{fus_sel['identical']:.3f} | "
                + (f"{c / sep['us']:.1f}x / {c / fus['us']:.1f}x |" if c else "- |"))
    return captioned(
        "Hierarchical selection as separate launches vs one fused kernel (same lists; step = "
        "select + sparse decode, one CUDA graph).",
        ["context", "B", "Hq", "budget", "cover", "select µs separate", "select µs fused",
         "step µs separate", "step µs fused", "fused / separate (step)",
         "identical to flat: separate / fused", "step vs cuDNN: separate / fused"], lines)


LAYER_COLS = [("ours_dense_layers_graph", "ours dense"),
              ("ours_sparse_quest_gpu_sel_layers_graph", "ours flat Quest step"),
              ("ours_sparse_hier_gpu_sel_layers_graph", "ours hierarchical step"),
              ("ours_sparse_reuse_layers_graph", "ours reuse step"),
              ("ours_sparse_quest_gpu_sel_reuse8_layers_graph", "ours flat Quest, R=8"),
              ("ours_sparse_hier_gpu_sel_reuse8_layers_graph", "ours hierarchical, R=8"),
              ("ours_sparse_hier_gpu_sel_reuse16_layers_graph", "ours hierarchical, R=16")]


def layers_table(ours_rows, peer_rows):
    """Per layer with 8 layers' attention in one CUDA graph (as a model's decode graph), ours
    and cuDNN's (the faster of its gqa / rows spellings), B = 1: no per-step graph launch."""
    peer = {}
    for r in peer_rows:
        if r["kind"].startswith("torch_layers_cudnn") and r.get("us"):
            peer[r["ctx"]] = min(peer.get(r["ctx"], r["us"]), r["us"])
    ours = {}
    for r in ours_rows:
        if r["kind"] in dict(LAYER_COLS) and r["batch"] == 1 and r.get("hq", 32) == 32:
            ours.setdefault(r["ctx"], {})[r["kind"]] = r["us"]
    lines = []
    for ctx in sorted(set(peer) | set(ours)):
        c, k = peer.get(ctx), ours.get(ctx, {})
        cells = []
        for kind, _ in LAYER_COLS:
            us = k.get(kind)
            cells.append(f"{us:.1f}" + (f" ({c / us:.2f}x)" if c else "") if us else "-")
        lines.append(f"| {ctx // 1024}K | " + (f"{c:.1f}" if c else "-") + " | "
                     + " | ".join(cells) + " |")
    return captioned(
        "Per layer inside an 8-layer CUDA graph (B 1, Hq 32; sparse steps: select + decode at a "
        "4096-token budget; reuse step: extend_kept + decode; R = R: one selection serving R "
        "steps, (fresh + (R - 1) x reuse) / R), µs (× cuDNN in the same kind of graph).",
        ["context", "cuDNN"] + [name for _, name in LAYER_COLS], lines)


def reuse_table(rows, cudnn):
    """Selection reuse (SessionOptions::reselect_every): the fresh step (select + decode), the
    step between selections (cuda::extend_kept + decode), and per step when one selection
    serves R steps, (fresh + (R - 1) x reuse) / R, with its speedup against cuDNN dense
    decode. The quality side is `masskv reuse` (docs/study.md)."""
    by = rows_by_shape(rows)
    lines = []
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        if "ours_sparse_reuse_step_graph" not in k:
            continue
        c = cudnn.get((ctx, batch, hq))
        us = lambda kind: f"{k[kind]['us']:.1f}" if kind in k else "-"
        cells = []
        for tag in ("quest", "hier"):
            for R in (4, 8, 16):
                kind = f"ours_sparse_{tag}_gpu_sel_reuse{R}_graph"
                cells.append(us(kind) + (f" ({c / k[kind]['us']:.1f}x)" if c and kind in k else ""))
        lines.append(f"| {ctx // 1024}K | {batch} | {hq} | {budget} | "
                     f"{us('ours_sparse_quest_gpu_sel_graph')} | {us('ours_sparse_hier_gpu_sel_graph')} | "
                     f"{us('ours_sparse_reuse_step_graph')} | " + " | ".join(cells) + " |")
    return captioned(
        "Selection reuse: µs per step when one selection serves R steps (× cuDNN dense decode); "
        "fresh = select + decode, reuse = extend_kept + decode, each one CUDA graph.",
        ["context", "B", "Hq", "budget", "flat step", "hier step", "reuse step"]
        + [f"{t} R={R}" for t in ("flat", "hier") for R in (4, 8, 16)], lines)


def gauss_table(rows, cudnn, ceiling):
    """Entmax-aware hierarchical selection (Gaussian-τ from pooled moments): selection µs, the
    step with softmax and with 1.5-entmax decode (CUDA graph), the bytes the entmax step reads
    (summaries, moments, K of the held pages) and its time against that bytes bound at the
    measured ceiling (issue 7: >= 0.8), speedup of the entmax step vs cuDNN dense decode."""
    by = rows_by_shape(rows)
    lines = []
    for (ctx, batch, hq, budget), k in sorted(by.items()):
        for tag in ("gauss", "gauss_adaptive", "gauss_fused"):
            sel, soft = k.get(f"gpu_{tag}_select"), k.get(f"ours_sparse_{tag}_gpu_sel_graph")
            ent = k.get(f"ours_entmax_sparse_{tag}_gpu_sel_graph")
            if not (sel and soft and ent):
                continue
            bound_us = ent["bytes"] / ceiling / 1e3
            c = cudnn.get((ctx, batch, hq))
            lines.append(
                f"| {ctx // 1024}K | {batch} | {hq} | {budget} | {tag} | {sel['us']:.1f} | "
                f"{soft['us']:.1f} | {ent['us']:.1f} | {ent['us'] / soft['us']:.2f} | "
                f"{ent['bytes'] / 1e6:.1f} | {bound_us:.1f} | {bound_us / ent['us']:.2f} | "
                + (f"{c / ent['us']:.1f}x |" if c else "- |"))
    return captioned(
        "Entmax-aware hierarchical selection (Gaussian-τ from moments pooled over 64 pages, "
        "alpha 1.5, cover 2; adaptive: pages whose rank reaches -margin = 0 only; fused: in one "
        "kernel). Steps in one CUDA graph. Bytes bound: the entmax step's bytes at the measured "
        "ceiling.",
        ["context", "B", "Hq", "budget", "rule", "select µs", "step softmax µs",
         "step entmax µs", "entmax / softmax", "entmax step MB", "bytes bound µs", "bound / time",
         "entmax step vs cuDNN"], lines)


def two_stage_table(rows, cudnn):
    """Two-stage selection (page bounds, then tokens on 2-bit codes) and token_codes (every
    token on its codes, no page stage) + token decode, beside the flat and hierarchical Quest
    steps at the same budget and cuDNN's dense decode: µs per step, CUDA graph each."""
    by = rows_by_shape(rows)
    lines = []
    for k, v in sorted(by.items()):
        if "ours_sparse_two_stage_gpu_sel_graph" not in v and \
                "ours_sparse_token_codes_gpu_sel_graph" not in v:
            continue
        us = lambda kind: f"{v[kind]['us']:.1f}" if kind in v else "-"
        c = cudnn.get((k[0], k[1], k[2]))
        vs = lambda kind: (f"{c / v[kind]['us']:.2f}x" if c and kind in v else "-")
        lines.append(f"| {k[0] // 1024}K | {k[1]} | {k[2]} | {k[3]} | "
                     f"{f'{c:.1f}' if c else '-'} | "
                     f"{us('ours_sparse_quest_gpu_sel_graph')} | {us('ours_sparse_hier_gpu_sel_graph')} | "
                     f"{us('gpu_two_stage_select_graph')} | {us('ours_sparse_two_stage_gpu_sel_graph')} | "
                     f"{us('gpu_token_codes_select_graph')} | "
                     f"{us('ours_sparse_token_codes_gpu_sel_graph')} | "
                     f"{vs('ours_sparse_token_codes_gpu_sel_graph')} | "
                     f"{us('gpu_token_codes_lse_select_graph')} | "
                     f"{us('ours_sparse_token_codes_lse_gpu_sel_graph')} | "
                     f"{vs('ours_sparse_token_codes_lse_gpu_sel_graph')} | "
                     f"{us('ours_sparse_token_codes_token_decode_graph')} | "
                     f"{us('ours_sparse_token_codes_lse_gpu_sel_layers_graph')} |")
    if not lines:
        return []
    return captioned(
        "Two-stage selection (candidate_factor 4: pages by bound, merged round robin, then their "
        "tokens on 2-bit codes) and token_codes (every token on its codes; the q heads merged "
        "round robin, or pooled by log-probability: +lse) + token decode, µs (CUDA graph), "
        "beside cuDNN's dense decode and the flat and hierarchical Quest steps at the same "
        "budget in tokens:",
        ["context", "B", "Hq", "budget", "cuDNN dense", "flat Quest step", "hier step",
         "two-stage select", "two-stage step", "token_codes select", "token_codes step",
         "token_codes vs cuDNN", "+lse select", "+lse step", "+lse vs cuDNN",
         "token decode alone", "+lse step per layer (8-layer graph)"],
        lines)


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    ceil_rows = [r for r in ours["rows"] if r["kind"].startswith("ceiling")]
    ceiling = max(r["bytes"] / r["us"] / 1e3 for r in ceil_rows)  # GB/s
    def best(prefix):  # fastest spelling (gqa / rows) of a backend per shape
        out = {}
        for r in peer["rows"]:
            if r["kind"].startswith(prefix) and r.get("us"):
                key = (r["ctx"], r["batch"], r.get("hq", 32))
                out[key] = min(out.get(key, r["us"]), r["us"])
        return out
    cudnn = best("torch_cudnn")
    flash = best("torch_flash")
    lines = [f"Device: {ours['device']} ({ours['sms']} SMs); torch {peer['torch']}.",
             f"Read ceiling (read-only kernel, 16-byte loads): {ceiling:.0f} GB/s "
             + ", ".join(f"{r['kind']} {r['bytes'] / 1e9:.2f} GB in {r['us']:.1f} us"
                         for r in ceil_rows) + "."]
    floors = [r for r in ours["rows"] if r["kind"].startswith("floor_graph_")]
    if floors:
        lines.append("Launch floor (empty kernels in one CUDA graph, timed as the steps): "
                     + ", ".join(f"{r['kind'].rsplit('_', 1)[1]} kernel(s) {r['us']:.1f} µs"
                                 for r in floors) + ".")
    lines += ["",
             "| row | context | B | Hq | budget (tokens) | bytes read | µs | GB/s | % of ceiling "
             "| cuDNN µs | flash µs | speedup vs cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table = []
    for r in ours["rows"]:
        if r["kind"].startswith(("ceiling", "floor_graph_")):
            continue
        key = (r["ctx"], r["batch"], r.get("hq", 32))
        gbs = r["bytes"] / r["us"] / 1e3
        # Peers only beside attention rows (selection-only rows are not attention) timed as
        # theirs (one call per timing; the "_layers_graph" rows have their own table).
        beside = r["kind"].startswith("ours_") and "_layers_" not in r["kind"]
        c = cudnn.get(key) if beside else None
        fl = flash.get(key) if beside else None
        row = dict(r, gbs=gbs, pct_ceiling=100 * gbs / ceiling, cudnn_us=c, flash_us=fl,
                   speedup_vs_cudnn=(c / r["us"]) if c else None)
        table.append(row)
        ctx = f"{r['ctx'] // 1024}K"
        fmt = lambda x, spec: format(x, spec) if x else "-"
        lines.append(
            f"| {r['kind']} | {ctx} | {r['batch']} | {r.get('hq', 32)} | {r['budget'] or '-'} | "
            f"{r['bytes'] / 1e6:.1f} MB | {r['us']:.1f} | {gbs:.0f} | {row['pct_ceiling']:.1f}% | "
            f"{fmt(c, '.1f')} | {fmt(fl, '.1f')} | "
            f"{fmt(row['speedup_vs_cudnn'], '.2f')}{'x' if c else ''} |")
    lines += sparse_table(ours["rows"])
    lines += entmax_table(ours["rows"])
    lines += compact_table(ours["rows"], cudnn)
    lines += fused_table(ours["rows"], cudnn)
    lines += layers_table(ours["rows"], peer["rows"])
    lines += reuse_table(ours["rows"], cudnn)
    lines += gauss_table(ours["rows"], cudnn, ceiling)
    lines += two_stage_table(ours["rows"], cudnn)
    lines += flex_table(ours["rows"], peer["rows"], cudnn)
    open(sys.argv[3], "w").write("\n".join(lines) + "\n")
    json.dump({"ceiling_gbs": ceiling, "ours": ours, "torch": peer, "table": table},
              open(sys.argv[4], "w"), indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Peer timings for masskv_gpu_bench: torch SDPA (cuDNN and flash backends) on the same decode
shapes (Hq=32, and 64 at 128K and 1M; Hkv=8, d=128, bf16, one query token), CUDA events, median of 100 after warm-up,
rotating over 8 caches when one cache is < 400 MB (so L2 does not serve it).

Two spellings of GQA decode, each timed for each backend (the report takes the faster):
"gqa": q [B, Hq, 1, d], k, v [B, Hkv, L, d], enable_gqa=True;
"rows": q [B, Hkv, G, d] against k, v [B, Hkv, L, d]: the G query heads of a kv group become
G query rows (no mask), the same arithmetic, each kv head read once.
Prefill (--prefill: prefill shapes only; the default runs both): causal SDPA at L = 8K, 32K,
128K, B = 1, q [1, Hq, L, d], k, v [1, Hkv, L, d], bf16, is_causal=True, spelled "gqa"
(enable_gqa=True) and "expand" (k, v repeated to Hq heads beforehand, not timed); FLOPs
4·d·Hq·L²/2. Median of 5 (10 at 8K) after 2 warm-ups.
FlexAttention (--flex, also in the default run): flex_attention (torch.compile) on the decode
shapes at 32K, 128K and 1M tokens, B = 1, with a block mask that keeps BUDGET tokens per kv head
(2K, 4K, 8K) as 128-token blocks chosen at random (the last block always), the same blocks for
the q heads of a group (enable_gqa=True): the peer's sparse decode at the bytes our sparse rows
read. Its selection is given (no scoring), like our *_cpu_sel rows.
Usage: python3 torch_peer.py OUT.json [--prefill] [--flex]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
# (context, batch, q heads): Hq = 64 (group 8) at two contexts beside the Hq = 32 grid.
SHAPES = [(1024, 1, 32), (32768, 1, 32), (131072, 1, 32), (524288, 1, 32), (1048576, 1, 32),
          (32768, 16, 32), (131072, 16, 32), (131072, 1, 64), (1048576, 1, 64)]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
PREFILL_LENS = [8192, 32768, 131072]
FLEX_CONTEXTS = [32768, 131072, 1048576]
FLEX_BUDGETS = [2048, 4096, 8192]
FLEX_BLOCK = 128


def time_us(fn, warm=10, iters=100):
    for i in range(warm):
        fn(i)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(warm + i)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1000.0


LAYERS = 8  # calls per CUDA graph in the "torch_layers_" rows (masskv_gpu_bench: kLayers)


def time_layers_graph_us(fn, layers=LAYERS, warm=5, iters=50):
    """Per call, with `layers` calls fn(0 .. layers - 1) in one CUDA graph, as a model's decode
    graph holds every layer's attention: the graph's launch is paid once for all of them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (plans, workspaces)
        for i in range(layers):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(layers):
            fn(i)
    for _ in range(warm):
        graph.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for a, b in ev:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1000.0 / layers


def prefill_rows(rows):
    for ctx in PREFILL_LENS:
        q = torch.randn(1, HQ, ctx, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HKV, ctx, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, HKV, ctx, D, device="cuda", dtype=torch.bfloat16)
        ke = k.repeat_interleave(HQ // HKV, dim=1)
        ve = v.repeat_interleave(HQ // HKV, dim=1)
        flops = 4.0 * D * HQ * ctx * ctx / 2
        iters = 10 if ctx <= 8192 else 5
        for name, backend in BACKENDS:
            for form, kk, vv, kw in (("gqa", k, v, {"enable_gqa": True}), ("expand", ke, ve, {})):
                kind = f"torch_prefill_{name}_{form}"
                try:
                    with sdpa_kernel([backend]):
                        us = time_us(lambda i: F.scaled_dot_product_attention(
                            q, kk, vv, is_causal=True, **kw), warm=2, iters=iters)
                    rows.append({"kind": kind, "ctx": ctx, "batch": 1, "us": us, "flops": flops})
                    print(f"prefill {name:6s} {form:6s} L={ctx:7d}: {us:11.1f} us "
                          f"{flops / us / 1e6:6.1f} TFLOP/s", flush=True)
                except Exception as e:  # a backend may refuse a shape: record it, go on
                    rows.append({"kind": kind, "ctx": ctx, "batch": 1, "us": None,
                                 "error": str(e)[:200]})
                    print(f"prefill {name:6s} {form:6s} L={ctx:7d}: failed: {str(e)[:200]}",
                          flush=True)
        del q, k, v, ke, ve
        torch.cuda.empty_cache()


def flex_rows(rows):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # FlexAttention missing in this torch: say so, go on
        rows.append({"kind": "torch_flex", "us": None, "error": str(e)[:200]})
        print(f"flex: unavailable: {str(e)[:200]}", flush=True)
        return
    g = HQ // HKV
    for ctx in FLEX_CONTEXTS:
        kv_bytes = ctx * HKV * D * 2 * 2
        rot = 8 if kv_bytes < 400e6 else 1
        ks = [torch.randn(1, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        vs = [torch.randn(1, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        qs = [torch.randn(1, HQ, 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        nblk = ctx // FLEX_BLOCK
        for budget in FLEX_BUDGETS:
            kind = "torch_flex_sparse"
            try:
                keep = torch.zeros(HKV, nblk, dtype=torch.bool, device="cuda")
                for h in range(HKV):
                    keep[h, torch.randperm(nblk - 1, device="cuda")[: budget // FLEX_BLOCK - 1]] = True
                keep[:, nblk - 1] = True
                keep = keep.repeat_interleave(g, dim=0)  # [HQ, nblk]: a group's heads share blocks

                def mask_mod(b, h, q_idx, kv_idx):
                    return keep[h, kv_idx // FLEX_BLOCK]

                bm = create_block_mask(mask_mod, 1, HQ, 1, ctx, device="cuda",
                                       BLOCK_SIZE=FLEX_BLOCK)
                us = time_us(lambda i: flex(qs[i % rot], ks[i % rot], vs[i % rot], block_mask=bm,
                                            enable_gqa=True))
                sel_bytes = budget * HKV * D * 2 * 2
                rows.append({"kind": kind, "ctx": ctx, "batch": 1, "budget": budget, "us": us,
                             "bytes": sel_bytes})
                print(f"flex sparse ctx={ctx:8d} budget={budget:5d} rot={rot}: {us:9.1f} us "
                      f"{sel_bytes / us / 1e3:7.1f} GB/s", flush=True)
            except Exception as e:  # compile or shape refused: record it, go on
                rows.append({"kind": kind, "ctx": ctx, "batch": 1, "budget": budget, "us": None,
                             "error": str(e)[:300]})
                print(f"flex sparse ctx={ctx:8d} budget={budget:5d}: failed: {str(e)[:300]}",
                      flush=True)
        del ks, vs, qs
        torch.cuda.empty_cache()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") \
        else "bench_torch.json"
    prefill_only = "--prefill" in sys.argv
    flex_only = "--flex" in sys.argv
    rows = []
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    if not flex_only:
        prefill_rows(rows)
    if not prefill_only:
        flex_rows(rows)
    for ctx, batch, hq in ([] if prefill_only or flex_only else SHAPES):
        kv_bytes = batch * ctx * HKV * D * 2 * 2
        rot = 8 if kv_bytes < 400e6 else 1
        ks = [torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        vs = [torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16) for _ in range(rot)]
        qs = {"rows": [torch.randn(batch, HKV, hq // HKV, D, device="cuda", dtype=torch.bfloat16)
                       for _ in range(rot)],
              "gqa": [torch.randn(batch, hq, 1, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(rot)]}
        for name, backend in BACKENDS:
            for form in ("gqa", "rows"):
                q = qs[form]
                kw = {"enable_gqa": True} if form == "gqa" else {}
                try:
                    with sdpa_kernel([backend]):
                        us = time_us(lambda i: F.scaled_dot_product_attention(
                            q[i % rot], ks[i % rot], vs[i % rot], **kw))
                    rows.append({"kind": f"torch_{name}_{form}", "ctx": ctx, "batch": batch,
                                 "hq": hq, "us": us, "bytes": kv_bytes})
                    print(f"{name:6s} {form:4s} ctx={ctx:8d} B={batch:2d} Hq={hq} rot={rot}: {us:9.1f} us "
                          f"{kv_bytes / us / 1e3:7.1f} GB/s", flush=True)
                except Exception as e:  # a backend may refuse a shape: record it, go on
                    rows.append({"kind": f"torch_{name}_{form}", "ctx": ctx, "batch": batch,
                                 "hq": hq, "us": None, "error": str(e)[:200]})
                    print(f"{name:6s} {form:4s} ctx={ctx:8d} B={batch:2d}: failed: {str(e)[:200]}",
                          flush=True)
                # The layer rows' shapes (masskv_gpu_bench's layer_shape): B 1, and B 16 at 128K.
                if name != "cudnn" or hq != HQ or not (batch == 1 or (batch, ctx) == (16, 131072)):
                    continue
                # Per layer inside a LAYERS-call CUDA graph (the "_layers_graph" rows of ours).
                kind = f"torch_layers_{name}_{form}"
                try:
                    with sdpa_kernel([backend]):
                        us = time_layers_graph_us(lambda i: F.scaled_dot_product_attention(
                            q[i % rot], ks[i % rot], vs[i % rot], **kw))
                    rows.append({"kind": kind, "ctx": ctx, "batch": batch, "hq": hq, "us": us,
                                 "bytes": kv_bytes})
                    print(f"{name:6s} {form:4s} ctx={ctx:8d} B={batch:2d}: per layer in a "
                          f"{LAYERS}-layer graph {us:9.1f} us", flush=True)
                except Exception as e:  # capture refused: record it, go on
                    rows.append({"kind": kind, "ctx": ctx, "batch": batch, "hq": hq, "us": None,
                                 "error": str(e)[:200]})
                    print(f"{name:6s} {form:4s} ctx={ctx:8d}: layers graph failed: {str(e)[:200]}",
                          flush=True)
        del ks, vs, qs
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""tools/gpu_bench/floor_report.py (issue 33's table) on a hand-made bench run: the floor's
arithmetic, the rows against cuDNN, the verdicts, the JSON schema and the one-card check."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "gpu_bench" / "floor_report.py"


def load():
    spec = importlib.util.spec_from_file_location("floor_report", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_run():
    def row(kind, ctx=0, batch=0, budget=0, us=0.0, nbytes=0, hq=32):
        return dict(kind=kind, ctx=ctx, batch=batch, budget=budget, us=us, bytes=nbytes, hq=hq)

    ours = {"device": "Test GPU", "sms": 1, "rows": [
        row("ceiling_read", us=1000.0, nbytes=3_000_000_000),      # 3e6 bytes a µs
        row("floor_graph_1", us=3.0), row("floor_graph_4", us=6.0),  # round trip 1 µs
        row("ours_sparse_hier_gpu_sel_layers_graph", 131072, 1, 4096, 40.0, 21_000_000),
        row("ours_sparse_hier_gpu_sel_layers_graph", 131072, 1, 4096, 99.0, 21_000_000, hq=64),
        row("ours_sparse_quest_gpu_sel_layers_graph", 131072, 1, 4096, 50.0, 30_000_000),
        row("ours_dense_graph", 131072, 1, 0, 190.0, 536_870_912),
        row("ours_sparse_quest_cpu_sel_graph", 131072, 1, 4096, 16.0),
        row("ours_entmax_sparse_quest_cpu_sel_graph", 131072, 1, 4096, 22.0)]}
    peer = {"torch": "t", "device": "Test GPU", "rows": [
        dict(kind="torch_cudnn_gqa", ctx=131072, batch=1, us=185.0),
        dict(kind="torch_cudnn_rows", ctx=131072, batch=1, us=183.0),
        dict(kind="torch_layers_cudnn_gqa", ctx=131072, batch=1, us=180.0),
        dict(kind="torch_prefill_cudnn_gqa", ctx=131072, batch=1, us=250000.0)]}
    prefill = {"device": "Test GPU", "sms": 1, "rows": [
        dict(kind="prefill_ours_dense", ctx=131072, batch=1, budget=0, us=350000.0),
        dict(kind="prefill_ours_sparse_with_index", ctx=131072, batch=1, budget=8192,
             us=45000.0)]}
    return ours, peer, prefill


def test_the_floor_and_the_rows():
    fr = load()
    ours, peer, prefill = bench_run()
    rows = fr.build(ours, peer, prefill)
    by = {(r["name"], r.get("scorer")): r for r in rows}
    hier, floor = by["sparse_step", "quest_hier"], by["floor", "quest_hier"]
    assert hier["ours_us"] == 40.0 and hier["cudnn_us"] == 180.0   # the Hq 64 row left out
    # 21e6 bytes at 3e6 bytes a µs, one launch of 3 µs, 3 stages of 1 µs.
    assert floor["ours_us"] == pytest.approx(7.0 + 3.0 + 3.0)
    assert floor["share_of_floor"] == pytest.approx(13.0 / 40.0)
    assert by["floor", "quest"]["ours_us"] == pytest.approx(10.0 + 3.0 + 2.0)
    dense = by["dense_decode", None]
    assert dense["cudnn_us"] == 183.0 and dense["speedup"] == pytest.approx(183.0 / 190.0)
    ent = by["entmax_sparse", "quest"]
    assert ent["entmax_over_softmax"] == pytest.approx(22.0 / 16.0)
    assert by["sparse_prefill", "block_index"]["speedup"] == pytest.approx(250000.0 / 45000.0)
    assert fr.verdict(hier) == "≥ 8.0×: missed (4.50×, 56% of it)"
    assert fr.verdict(floor) == "floor / step ≥ 75%: missed (32%)"
    assert fr.verdict(ent).startswith("≤ 1.2: missed by 0.18")
    assert fr.verdict(by["dense_prefill", None]).startswith("≥ 1.0×: missed (0.71×")


def test_the_command_writes_the_schema_and_refuses_two_cards(tmp_path):
    ours, peer, prefill = bench_run()
    paths = {}
    for name, d in (("ours", ours), ("torch", peer), ("prefill", prefill)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(d))
    md, js = tmp_path / "floor.md", tmp_path / "floor.json"
    subprocess.run([sys.executable, str(TOOL), str(paths["ours"]), str(paths["torch"]),
                    str(paths["prefill"]), str(md), str(js), "--command", "gpu.sh"],
                   check=True, capture_output=True)
    out = json.loads(js.read_text())
    assert out["card"] == "Test GPU" and out["command"] == "gpu.sh"
    names = {r["name"] for r in out["rows"]}
    assert names == {"sparse_step", "floor", "dense_decode", "dense_prefill", "sparse_prefill",
                     "entmax_sparse"}
    assert all({"name", "ctx", "batch", "scorer", "ours_us", "cudnn_us"} <= set(r)
               for r in out["rows"])
    assert "read ceiling 3.00 TB/s" in md.read_text()
    peer["device"] = "Other GPU"
    paths["torch"].write_text(json.dumps(peer))
    r = subprocess.run([sys.executable, str(TOOL), str(paths["ours"]), str(paths["torch"]), "-",
                        str(md), str(js)], capture_output=True, text=True)
    assert r.returncode != 0 and "ratios need one card" in r.stderr

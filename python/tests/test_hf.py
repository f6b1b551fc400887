"""masskv attention inside a small randomly initialised Llama (transformers). Skipped where torch
or transformers are absent (CI); run on the GPU machine (scripts/gpu.sh)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import masskv.hf  # noqa: E402


def tiny_llama(attn, head_dim=32):
    """2 layers, 4 q heads, 2 kv heads of head_dim (the CUDA kernels serve 64, 128, 256)."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=4 * head_dim, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    else:
        model.config._attn_implementation = attn
    return model


def step_logits(model, prompt, steps):
    """Greedy decode with the model's cache; logits of the prompt and of every step."""
    out = []
    with torch.no_grad():
        r = model(prompt, use_cache=True)
        out.append(r.logits[:, -1])
        past = r.past_key_values
        tok = r.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            r = model(tok, past_key_values=past, use_cache=True)
            out.append(r.logits[:, -1])
            past = r.past_key_values
            tok = r.logits[:, -1:].argmax(-1)
    return torch.stack(out)


@pytest.mark.parametrize("method, budget_tokens", [("dense", 0), ("quest", 4096)])
def test_masskv_attention_equals_transformers_eager(method, budget_tokens):
    attn = masskv.hf.MasskvAttention(method=method, budget_tokens=budget_tokens, page_size=4)
    name = attn.register("masskv_test")
    prompt = torch.randint(0, 128, (2, 37), generator=torch.Generator().manual_seed(1))
    ref = step_logits(tiny_llama("eager"), prompt, 6)
    got = step_logits(tiny_llama(name), prompt, 6)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    if method == "quest":
        assert attn.last_selected_fraction[0] == 1.0  # the budget covers everything


def test_sparse_selector_reads_fewer_tokens():
    attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=16, page_size=4)
    name = attn.register("masskv_sparse_test")
    prompt = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(2))
    logits = step_logits(tiny_llama(name), prompt, 2)
    assert torch.isfinite(logits).all()
    assert attn.last_selected_fraction[1] < 0.2


def padded_batch(B=3, S=19, pads=(0, 5, 11), seed=11):
    """Token ids and a left-padding mask: row b's first pads[b] columns are padding (id 0)."""
    ids = torch.randint(1, 128, (B, S), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, S, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    return ids.masked_fill(mask == 0, 0), mask


def padded_logits(model, ids, mask, cuts, steps, cache, tokens=None):
    """Logits of the last column of every prefill chunk (ids split at `cuts`) and of `steps`
    greedy steps (or the fed `tokens` (steps, B)), with transformers' left-padding convention:
    the mask over every column so far, positions counting each row's tokens only."""
    out, pos = [], (mask.cumsum(-1) - 1).clamp(min=0)
    edges = [0, *cuts, ids.shape[1]]
    with torch.no_grad():
        for a, b in zip(edges, edges[1:]):
            r = model(ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                      past_key_values=cache, use_cache=True)
            out.append(r.logits[:, -1])
        tok, last = r.logits[:, -1:].argmax(-1), pos[:, -1:]
        for i in range(steps):
            if tokens is not None:
                tok = tokens[i][:, None]
            mask = torch.cat([mask, torch.ones_like(tok)], 1)
            last = last + 1
            r = model(tok, attention_mask=mask, position_ids=last, past_key_values=cache,
                      use_cache=True)
            out.append(r.logits[:, -1])
            tok = r.logits[:, -1:].argmax(-1)
    return torch.stack(out)


@pytest.mark.parametrize("method, budget_tokens, pads", [
    ("dense", 0, (0, 5, 11)), ("quest", 4096, (0, 5, 11)), ("dense", 0, (9, 12, 15))])
def test_left_padded_batch_matches_eager(method, budget_tokens, pads):
    """Rows of different lengths, padded on the left (one row's padding spans the first
    prefill chunk): masskv's CPU path keeps only the tokens and gives eager's logits, in
    generate() and chunk by chunk."""
    attn = masskv.hf.MasskvAttention(method=method, budget_tokens=budget_tokens, page_size=4)
    model = tiny_llama(attn.register(f"masskv_padded_{method}_{pads[0]}"))
    eager = tiny_llama("eager")
    ids, mask = padded_batch(pads=pads)
    ref = padded_logits(eager, ids, mask, [8], 4, transformers.DynamicCache(config=eager.config))
    got = padded_logits(model, ids, mask, [8], 4, transformers.DynamicCache(config=model.config))
    # A row whose first chunk is all padding has no token in its last column (no logits).
    first = [b for b, p in enumerate(pads) if p < 8]
    torch.testing.assert_close(got[0, first], ref[0, first], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1:], ref[1:], atol=1e-4, rtol=1e-4)
    (state,) = [s for m, s in attn._states.items() if m.layer_idx == 0]
    assert [state.cache.length(s) for s in state.seqs] == [19 - p + 4 for p in pads]
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **kw), eager.generate(ids, **kw))


def test_padding_not_on_the_left_is_rejected():
    attn = masskv.hf.MasskvAttention()
    model = tiny_llama(attn.register("masskv_pad_test"))
    ids = torch.randint(0, 128, (2, 8))
    for cols in (slice(5, 8), slice(2, 4)):  # right padding; a hole inside a row
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, cols] = 0
        with pytest.raises(ValueError, match="padded on the left"):
            with torch.no_grad():
                model(ids, attention_mask=mask)


cuda = pytest.mark.skipif(not (masskv.has_cuda and torch.cuda.is_available()),
                          reason="needs a CUDA build of masskv and a GPU")


def greedy(model, prompt, steps):
    """Greedy tokens and the logits of every step (the model's own cache)."""
    logits = step_logits(model, prompt, steps)
    return logits.argmax(-1), logits


@cuda
def test_cuda_tensors_stay_on_the_gpu_and_match_sdpa():
    """A bf16 Llama on the GPU: masskv dense decode gives transformers SDPA's greedy tokens with
    logits within bf16 noise; Quest with a budget covering everything gives dense's logits; the
    GPU cache (not the CPU one) holds the tokens."""
    prompt = torch.randint(0, 128, (2, 45), generator=torch.Generator().manual_seed(3)).cuda()
    ref_model = tiny_llama("sdpa", 64).cuda().to(torch.bfloat16)
    ref_tok, ref = greedy(ref_model, prompt, 8)
    dense = masskv.hf.MasskvAttention(method="dense", page_size=16)
    model = tiny_llama(dense.register("masskv_cuda_dense"), 64).cuda().to(torch.bfloat16)
    got_tok, got = greedy(model, prompt, 8)
    assert torch.equal(got_tok, ref_tok)
    torch.testing.assert_close(got.float(), ref.float(), atol=0.1, rtol=0)
    assert not dense._states and dense._cuda is not None  # nothing mirrored on the CPU
    full = masskv.hf.MasskvAttention(method="quest", budget_tokens=4096, page_size=16)
    full_tok, full_logits = greedy(
        tiny_llama(full.register("masskv_cuda_full"), 64).cuda().to(torch.bfloat16), prompt, 8)
    assert torch.equal(full_tok, got_tok)
    torch.testing.assert_close(full_logits.float(), got.float(), atol=2e-2, rtol=0)


@cuda
@pytest.mark.parametrize("hierarchical", [False, True])
def test_cuda_quest_reads_a_budget(hierarchical):
    attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=32, sink_pages=1,
                                     page_size=16, hierarchical=hierarchical)
    model = tiny_llama(attn.register(f"masskv_cuda_sparse_{hierarchical}"), 64).cuda().to(
        torch.bfloat16)
    prompt = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(4)).cuda()
    logits = step_logits(model, prompt, 3)
    assert torch.isfinite(logits.float()).all()
    ids, count = attn.last_selection[1]
    assert ids.is_cuda and int(count.max()) * 16 < 300 / 2


@cuda
def test_cuda_unsupported_method_is_named():
    attn = masskv.hf.MasskvAttention(method="top_p")
    model = tiny_llama(attn.register("masskv_cuda_top_p"), 64).cuda()
    with pytest.raises(ValueError, match="on CUDA tensors the methods are dense, quest"):
        step_logits(model, torch.randint(0, 128, (1, 20)).cuda(), 1)


def test_gpu_path_flow_on_cpu_tensors(monkeypatch):
    """masskv.hf_cuda's control flow, run on CPU tensors: the GPU path's append is a CUDA
    kernel, so it is replaced by a plain pool write here (no summaries: method dense reads none);
    the rest is the real code — one cache per model, the step begun by the first layer, the
    prefill by transformers' SDPA, the decode by masskv's decode operator (its CPU kernel) over
    the bf16 pool. Greedy tokens must be eager's, logits within bf16 noise."""
    from transformers import AttentionInterface

    from masskv.hf_cuda import CudaLayers
    from masskv.torch_cache import TorchPagedCache

    # The append without its summaries: the pool part of TorchPagedCache.append alone.
    monkeypatch.setattr(TorchPagedCache, "append", TorchPagedCache._write_rows)
    layers = CudaLayers()
    attn = masskv.hf.MasskvAttention(method="dense", page_size=4)

    def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        return layers(attn, module, query, key, value, attention_mask, scaling, **kw)

    AttentionInterface.register("masskv_gpu_flow", fn)
    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionMaskInterface.register("masskv_gpu_flow", sdpa_mask)
    except ImportError:
        pass
    prompt = torch.randint(0, 128, (2, 23), generator=torch.Generator().manual_seed(5))
    ref = step_logits(tiny_llama("eager", 64), prompt, 5)
    model = tiny_llama("masskv_gpu_flow", 64)
    got = step_logits(model, prompt, 5)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    torch.testing.assert_close(got, ref, atol=5e-2, rtol=0)
    (state,) = layers._states.values()           # one cache for the model's two layers
    assert state.cache.length(state.seqs[0]) == 23 + 5 and state.cache.dtype == torch.bfloat16
    del model                                    # the cache goes with the model
    import gc

    gc.collect()
    assert not layers._states


def cache_logits(model, chunks, steps, cache, tokens=None):
    """Logits of every prefill chunk's last token and of every greedy step, with `cache` as
    transformers' cache. tokens (steps, batch): the tokens fed (teacher forcing), so that a
    near tie that bf16 rounding breaks the other way does not change every later step."""
    out = []
    with torch.no_grad():
        for c in chunks:
            r = model(c, past_key_values=cache, use_cache=True)
            out.append(r.logits[:, -1])
        tok = r.logits[:, -1:].argmax(-1)
        for i in range(steps):
            if tokens is not None:
                tok = tokens[i][:, None]
            r = model(tok, past_key_values=cache, use_cache=True)
            out.append(r.logits[:, -1])
            tok = r.logits[:, -1:].argmax(-1)
    return torch.stack(out)


def decisive_steps(logits, margin):
    """How many leading steps of greedy `logits` (steps, batch, vocab) pick their token by at
    least `margin` in every row: past the first closer call, bf16 rounding may pick the other."""
    top2 = logits.float().topk(2, dim=-1).values
    clear = ((top2[..., 0] - top2[..., 1]) >= margin).all(-1)
    return int(clear.int().cumprod(0).sum())


def test_masskv_cache_flow_on_cpu_tensors(monkeypatch):
    """masskv.hf_cache.MasskvCache as the model's cache (no dense copy), run on CPU tensors with
    the append replaced by its pool write (as above): a prompt in two chunks (the second
    attends to the first through the pool's history), then greedy steps decoded from the pool.
    The pool starts at 8 tokens a row and grows. Logits as eager's within bf16 noise, the same
    greedy tokens; no layer keeps tensors of its own."""
    from masskv.hf_cache import MasskvCache
    from masskv.torch_cache import TorchPagedCache

    monkeypatch.setattr(TorchPagedCache, "append", TorchPagedCache._write_rows)
    attn = masskv.hf.MasskvAttention(method="dense", page_size=4)
    model = tiny_llama(attn.register("masskv_cache_flow"), 64)
    prompt = torch.randint(0, 128, (2, 23), generator=torch.Generator().manual_seed(6))
    eager = tiny_llama("eager", 64)
    ref = cache_logits(eager, [prompt[:, :15], prompt[:, 15:]], 5,
                       transformers.DynamicCache(config=eager.config))
    cache = MasskvCache(attn, model.config, max_tokens=8)
    got = cache_logits(model, [prompt[:, :15], prompt[:, 15:]], 5, cache)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    torch.testing.assert_close(got, ref, atol=5e-2, rtol=0)
    assert cache.get_seq_length() == 23 + 5 and cache.batch_size == 2
    assert cache.paged.capacity_pages > 2 * (8 // 4 + 1)       # it grew
    assert all(layer.keys is None for layer in cache.layers)   # no dense copy
    assert not attn._states                                    # nothing mirrored either
    with pytest.raises(ValueError, match="batch of 1 rows"):
        with torch.no_grad():
            model(prompt[:1, :3], past_key_values=cache)
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.paged.free_pages == cache.paged.capacity_pages
    # generate() with it: eager's greedy tokens.
    with torch.no_grad():
        want = eager.generate(prompt, max_new_tokens=6, do_sample=False)
        got = model.generate(prompt, past_key_values=MasskvCache(attn, model.config),
                             max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("own_cache, pads", [(False, (0, 5, 11)), (True, (0, 5, 11)),
                                             (False, (9, 12, 15)), (True, (9, 12, 15))])
def test_gpu_path_flow_serves_a_left_padded_batch(monkeypatch, own_cache, pads):
    """The GPU path's flow (append stubbed by its pool write, as above) on a left-padded batch
    in two prefill chunks, one row all padding in the first: with transformers' cache
    (CudaLayers mirrors each row's tokens) and with MasskvCache (the pool alone; the second
    chunk's SDPA reads the history gathered from it). Eager's logits within bf16 noise, and
    the pool holds each row's tokens only."""
    from masskv.hf_cache import MasskvCache
    from masskv.torch_cache import TorchPagedCache

    monkeypatch.setattr(TorchPagedCache, "append", TorchPagedCache._write_rows)
    attn = masskv.hf.MasskvAttention(method="dense", page_size=4)
    name = attn.register(f"masskv_padded_flow_{own_cache}_{pads[0]}")
    if not own_cache:  # the CUDA branch on CPU tensors, as test_gpu_path_flow_on_cpu_tensors
        from transformers import AttentionInterface

        from masskv.hf_cuda import CudaLayers

        attn._cuda = CudaLayers()

        def fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
            B, _, T, _ = query.shape
            counts = masskv.hf.real_counts(attention_mask, B, T, key.shape[2]) if T > 1 \
                else None
            return attn._cuda(attn, module, query, key, value, attention_mask, scaling,
                              counts, **kw)

        AttentionInterface.register(name, fn)
    model = tiny_llama(name, 64)
    eager = tiny_llama("eager", 64)
    ids, mask = padded_batch(pads=pads)
    ref = padded_logits(eager, ids, mask, [8], 4, transformers.DynamicCache(config=eager.config))
    cache = (MasskvCache(attn, model.config, max_tokens=8) if own_cache
             else transformers.DynamicCache(config=model.config))
    got = padded_logits(model, ids, mask, [8], 4, cache)
    first = [b for b, p in enumerate(pads) if p < 8]  # rows with a token in the first chunk
    torch.testing.assert_close(got[0, first], ref[0, first], atol=5e-2, rtol=0)
    torch.testing.assert_close(got[1:], ref[1:], atol=5e-2, rtol=0)
    if own_cache:
        paged, seqs = cache.paged, cache.seqs
        assert cache.get_seq_length() == 19 + 4
    else:
        (state,) = attn._cuda._states.values()
        paged, seqs = state.cache, state.seqs
    assert [paged.length(s) for s in seqs] == [19 - p + 4 for p in pads]


def test_static_masskv_cache_flow_on_cpu_tensors(monkeypatch):
    """MasskvCache(static=True) on CPU tensors (append stubbed by its pool write): the decode
    steps advance on the device alone (TorchPagedCache.static_step; the host counts them for
    get_seq_length, sync() reads the device's lengths back), a later prefill chunk ends them,
    and every logit is eager's within bf16 noise; generate() gives eager's tokens, also for a
    second turn on the same cache; a step past max_tokens is refused."""
    from masskv.hf_cache import MasskvCache
    from masskv.torch_cache import TorchPagedCache

    monkeypatch.setattr(TorchPagedCache, "append", TorchPagedCache._write_rows)
    attn = masskv.hf.MasskvAttention(method="dense", page_size=4)
    model = tiny_llama(attn.register("masskv_static_flow"), 64)
    eager = tiny_llama("eager", 64)
    prompt = torch.randint(0, 128, (2, 23), generator=torch.Generator().manual_seed(9))
    cache = MasskvCache(attn, model.config, max_tokens=48, static=True)
    assert cache.layers[0].is_compileable
    ref_cache = transformers.DynamicCache(config=eager.config)
    ref = cache_logits(eager, [prompt[:, :15]], 5, ref_cache)
    got = cache_logits(model, [prompt[:, :15]], 5, cache)
    torch.testing.assert_close(got, ref, atol=5e-2, rtol=0)
    assert cache.paged.static_active and cache.get_seq_length() == 20  # counted on the host
    cache.sync()
    assert cache.get_seq_length() == 20 and not cache.paged.static_active
    # A second turn: a chunk after the decode steps, then more steps.
    turn = prompt[:, 15:]
    ref2 = cache_logits(eager, [turn], 3, ref_cache)
    got2 = cache_logits(model, [turn], 3, cache)
    torch.testing.assert_close(got2, ref2, atol=5e-2, rtol=0)
    cache.sync()
    assert cache.get_seq_length() == 31 and [cache.paged.length(s) for s in cache.seqs] == [31, 31]
    with pytest.raises(ValueError, match="give max_tokens"):
        MasskvCache(attn, model.config, static=True)
    with torch.no_grad():
        want = eager.generate(prompt, max_new_tokens=6, do_sample=False)
        turns = MasskvCache(attn, model.config, max_tokens=64, static=True)
        got = model.generate(prompt, max_new_tokens=6, do_sample=False, past_key_values=turns)
        assert torch.equal(got, want)
        # A second turn on the same cache: generate() reads get_seq_length() to cut the new
        # tokens, before any layer runs.
        more = torch.cat([want, prompt[:, :4]], 1)
        want2 = eager.generate(more, max_new_tokens=5, do_sample=False)
        got2 = model.generate(more, max_new_tokens=5, do_sample=False, past_key_values=turns)
        assert torch.equal(got2, want2)
        short = MasskvCache(attn, model.config, max_tokens=26, static=True)
        with pytest.raises(ValueError, match="past max_tokens"):
            model.generate(prompt, max_new_tokens=6, do_sample=False, past_key_values=short)


def test_static_decode_steps_trace_once(monkeypatch):
    """The static decode step under torch.compile (dynamo, a backend that runs the traced
    graphs as they are, on CPU tensors with the append stubbed): eager's logits within bf16
    noise, and no new graph after the second step — the per-step Python state a guard could
    see (lengths, page lists) stays out of the traced code. The only graph breaks are the CPU
    page table's read of its length (a CUDA cache passes the whole index buffer instead)."""
    from masskv.hf_cache import MasskvCache
    from masskv.torch_cache import TorchPagedCache

    monkeypatch.setattr(TorchPagedCache, "append", TorchPagedCache._write_rows)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    attn = masskv.hf.MasskvAttention(method="dense", page_size=4)
    model = tiny_llama(attn.register("masskv_static_trace"), 64)
    eager = tiny_llama("eager", 64)
    prompt = torch.randint(0, 128, (2, 23), generator=torch.Generator().manual_seed(10))
    cache = MasskvCache(attn, model.config, max_tokens=64, static=True)
    ref_cache = transformers.DynamicCache(config=eager.config)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = torch.compile(model, backend=backend)
    seen = []
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
        tok = eager(prompt, past_key_values=ref_cache, use_cache=True).logits[:, -1:].argmax(-1)
        cache.begin_static()
        for i in range(4):
            pos = torch.full((2, 1), 23 + i, dtype=torch.long)
            got = step(input_ids=tok, position_ids=pos, past_key_values=cache,
                       use_cache=True).logits[:, -1]
            want = eager(input_ids=tok, position_ids=pos, past_key_values=ref_cache,
                         use_cache=True).logits[:, -1]
            torch.testing.assert_close(got, want, atol=5e-2, rtol=0)
            seen.append(len(graphs))
            tok = want[:, None].argmax(-1)
    torch._dynamo.reset()
    assert seen[1] == seen[2] == seen[3], seen  # traced for step 1 (and 2), reused after
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert all("item()" in reason for reason in breaks), list(breaks)
    cache.sync()
    assert cache.get_seq_length() == 27


def test_masskv_cache_rejects_what_it_cannot_serve():
    from masskv.hf_cache import MasskvCache

    attn = masskv.hf.MasskvAttention(method="dense")
    with pytest.raises(ValueError, match="config"):
        MasskvCache(attn, object())
    cache = MasskvCache(attn, tiny_llama("eager").config)
    with pytest.raises(NotImplementedError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(ValueError, match="max_tokens"):
        MasskvCache(attn, tiny_llama("eager").config, max_tokens=0)


@cuda
@pytest.mark.parametrize("method, budget_tokens", [("dense", 0), ("quest", 4096),
                                                   ("token_codes", 4096)])
def test_cuda_masskv_cache_matches_sdpa(method, budget_tokens):
    """On the GPU with MasskvCache: generate() gives SDPA's greedy tokens (budget covering
    everything for quest), and the only KV is masskv's pool."""
    from masskv.hf_cache import MasskvCache

    prompt = torch.randint(0, 128, (2, 45), generator=torch.Generator().manual_seed(7)).cuda()
    ref_model = tiny_llama("sdpa", 64).cuda().to(torch.bfloat16)
    ref_tok, ref = greedy(ref_model, prompt, 8)
    attn = masskv.hf.MasskvAttention(method=method, budget_tokens=budget_tokens, page_size=16)
    model = tiny_llama(attn.register(f"masskv_cuda_cache_{method}"), 64).cuda().to(torch.bfloat16)
    cache = MasskvCache(attn, model.config, max_tokens=32)
    # SDPA's tokens fed to both: the logits of every step are compared on the same inputs.
    got = cache_logits(model, [prompt[:, :30], prompt[:, 30:]], 8, cache, tokens=ref_tok)
    torch.testing.assert_close(got[1:].float(), ref.float(), atol=0.1, rtol=0)
    # Greedy choices agree up to the first step SDPA itself picks by less than twice that noise.
    n = decisive_steps(ref, 0.2)
    assert torch.equal(got[1:1 + n].argmax(-1), ref_tok[:n])
    assert all(layer.keys is None for layer in cache.layers)
    gen = model.generate(prompt, past_key_values=MasskvCache(attn, model.config),
                         max_new_tokens=8, do_sample=False)
    assert torch.equal(gen[:, 45:45 + n], ref_tok[:n].T)  # ref_tok: (steps + 1, batch)


@cuda
@pytest.mark.parametrize("budget", [0, 4096])
def test_cuda_masskv_prefill_gives_sdpa_tokens(budget):
    """prefill="masskv": the prompt attended by masskv's CUDA prefill (dense, or block-sparse
    with a budget covering every block) gives SDPA's greedy tokens, logits within bf16 noise."""
    prompt = torch.randint(0, 128, (2, 150), generator=torch.Generator().manual_seed(8)).cuda()
    ref_tok, ref = greedy(tiny_llama("sdpa", 64).cuda().to(torch.bfloat16), prompt, 4)
    attn = masskv.hf.MasskvAttention(method="dense", prefill="masskv",
                                     prefill_budget_tokens=budget)
    model = tiny_llama(attn.register(f"masskv_cuda_prefill_{budget}"), 64).cuda().to(
        torch.bfloat16)
    got_tok, got = greedy(model, prompt, 4)
    assert torch.equal(got_tok, ref_tok)
    torch.testing.assert_close(got.float(), ref.float(), atol=0.1, rtol=0)


@cuda
@pytest.mark.parametrize("method, hierarchical, prefill, own_cache", [
    ("dense", False, "sdpa", False), ("quest", True, "sdpa", True),
    ("quest", False, "masskv", True), ("dense", False, "masskv", False),
    ("token_codes", False, "sdpa", True)])
def test_cuda_left_padded_batch_matches_sdpa(method, hierarchical, prefill, own_cache):
    """A left-padded bf16 batch on the GPU (one row all padding in the first prefill chunk):
    SDPA's logits within bf16 noise on SDPA's tokens (budget covering everything), and each
    row's pool holds its tokens only."""
    from masskv.hf_cache import MasskvCache

    ids, mask = padded_batch(S=150, pads=(0, 40, 90))
    ids, mask = ids.cuda(), mask.cuda()
    ref_model = tiny_llama("sdpa", 64).cuda().to(torch.bfloat16)
    ref = padded_logits(ref_model, ids, mask, [64], 6,
                        transformers.DynamicCache(config=ref_model.config))
    tokens = ref[2:].argmax(-1)  # SDPA's greedy tokens, fed to both
    ref = padded_logits(ref_model, ids, mask, [64], 6,
                        transformers.DynamicCache(config=ref_model.config), tokens)
    attn = masskv.hf.MasskvAttention(method=method, budget_tokens=4096 if method != "dense"
                                     else 0, hierarchical=hierarchical, prefill=prefill)
    model = tiny_llama(attn.register(f"masskv_cuda_pad_{method}_{prefill}_{own_cache}"),
                       64).cuda().to(torch.bfloat16)
    cache = (MasskvCache(attn, model.config) if own_cache
             else transformers.DynamicCache(config=model.config))
    got = padded_logits(model, ids, mask, [64], 6, cache, tokens)
    # Row 2's first chunk is all padding: its last column is no token.
    torch.testing.assert_close(got[0, :2].float(), ref[0, :2].float(), atol=0.1, rtol=0)
    torch.testing.assert_close(got[1:].float(), ref[1:].float(), atol=0.1, rtol=0)
    if own_cache:
        paged, seqs = cache.paged, cache.seqs
    else:
        (state,) = attn._cuda._states.values()
        paged, seqs = state.cache, state.seqs
    assert [paged.length(s) for s in seqs] == [156, 116, 66]


@cuda
@pytest.mark.parametrize("hierarchical", [False, True])
def test_cuda_static_masskv_cache_under_reduce_overhead(hierarchical):
    """MasskvCache(static=True): the model's decode step under torch.compile(mode=
    "reduce-overhead") (CUDA graphs; every step's page table written on the device) gives
    SDPA's logits within bf16 noise on SDPA's tokens (budget covering everything), the same
    greedy picks up to SDPA's first close call, and the lengths advance on the device."""
    from masskv.hf_cache import MasskvCache

    prompt = torch.randint(0, 128, (2, 45), generator=torch.Generator().manual_seed(12)).cuda()
    ref_tok, ref = greedy(tiny_llama("sdpa", 64).cuda().to(torch.bfloat16), prompt, 8)
    attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=4096,
                                     hierarchical=hierarchical)
    model = tiny_llama(attn.register(f"masskv_cuda_static_{hierarchical}"), 64).cuda().to(
        torch.bfloat16)
    cache = MasskvCache(attn, model.config, max_tokens=128, static=True)
    with torch.no_grad():
        out = [model(prompt, past_key_values=cache, use_cache=True).logits[:, -1]]
        cache.begin_static()
        step = torch.compile(model, mode="reduce-overhead")
        for i in range(8):
            pos = torch.full((2, 1), 45 + i, device="cuda", dtype=torch.long)
            r = step(input_ids=ref_tok[i][:, None], position_ids=pos, past_key_values=cache,
                     use_cache=True)
            out.append(r.logits[:, -1].clone())
    masskv.ops.check(torch.cuda.current_stream())  # nothing flagged by the replayed kernels
    got = torch.stack(out)
    torch.testing.assert_close(got.float(), ref.float(), atol=0.1, rtol=0)
    n = decisive_steps(ref, 0.2)
    assert torch.equal(got[:n].argmax(-1), ref_tok[:n])
    # The static steps run on the device alone; the host counts them as they run (no read).
    assert cache.get_seq_length() == 53
    cache.sync()
    assert cache.get_seq_length() == 53 and [cache.paged.length(s) for s in cache.seqs] == [53, 53]

"""masskv attention inside a small randomly initialised Llama (transformers). Skipped where torch
or transformers are absent (CI); run on the GPU machine (scripts/gpu.sh)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import masskv.hf  # noqa: E402


def tiny_llama(attn):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
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


def test_padding_is_rejected():
    attn = masskv.hf.MasskvAttention()
    name = attn.register("masskv_pad_test")
    model = tiny_llama(name)
    ids = torch.randint(0, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match="padded"):
        with torch.no_grad():
            model(ids, attention_mask=mask)

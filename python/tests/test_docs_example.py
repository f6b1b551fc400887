"""docs/python.md's example runs and prints what the doc shows (numbers to 0.1%: another CPU
may take another SIMD path and differ in the last bits)."""

import contextlib
import io
import math
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"
NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def same_line(got, want):
    if NUMBER.sub("#", got) != NUMBER.sub("#", want):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=1e-3, abs_tol=1e-12)
               for a, b in zip(NUMBER.findall(got), NUMBER.findall(want)))


def test_docs_example_runs_and_output_matches_the_doc():
    text = DOC.read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    shown = re.search(r"Output.*?```text\n(.*?)```", text, re.S).group(1)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, str(DOC), "exec"), {})
    got, want = buf.getvalue().splitlines(), shown.splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert same_line(g, w), (g, w)


def test_type_stubs_are_installed_with_the_module():
    import masskv

    stub = pathlib.Path(masskv.__file__).parent / "_masskv.pyi"
    text = stub.read_text()
    assert "def decode(q: numpy.typing.ArrayLike, kv: KV" in text
    assert "class PagedKVCache" in text and "std::" not in text
    assert (pathlib.Path(masskv.__file__).parent / "py.typed").exists()

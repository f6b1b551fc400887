"""One look for every masskv plot: a method (selector) has the same colour in every plot of a
run and across runs, budgets read as fractions (1/32, 1/16) or tokens, lengths as 1K, 2K, and
95 % intervals come from one formula. Imported by the scripts/plot_*.py beside it."""
import math
import zlib
from fractions import Fraction

# Fixed colours for the methods the reports compare (matplotlib's tab10 / tab20 hues); a
# method not listed gets a tab20 colour from a hash of its name, so it is stable too.
_FIXED = {
    "dense": "#000000",
    "dense_entmax": "#7f7f7f",
    "sink_recent": "#8c564b",
    "quest": "#1f77b4",
    "top_p": "#ff7f0e",
    "top_p_q4": "#ffbb78",
    "oracle": "#2ca02c",
    "learned": "#9467bd",
    "entmax_support": "#7f3b08",
    "gaussian_tau": "#e377c2",
    "two_stage": "#17becf",
    "token_codes": "#d62728",  # the default selector: red, apart from the oracle's green
    "prefill_token": "#bcbd22",
}
_TAB20 = ["#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896",
          "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7",
          "#bcbd22", "#dbdb8d", "#17becf", "#9edae5"]
DENSE = ("dense", "dense_entmax")


def color(method):
    """The method's colour: its base name's (quest@8 is drawn like quest, with another marker)."""
    base = method.split("@")[0]
    if base in _FIXED:
        return _FIXED[base]
    return _TAB20[zlib.crc32(base.encode()) % len(_TAB20)]


def marker(method):
    """Reuse variants (METHOD@R...) get their own marker; plain methods a circle."""
    if "@" not in method:
        return "o"
    return ["s", "^", "v", "D", "P", "X"][zlib.crc32(method.encode()) % 6]


def linestyle(method):
    return "--" if method in DENSE else "-"


def budget_value(budget, length=None):
    """Sort key of a budget label: a fraction as is, tokens as a fraction of `length` (or of
    a large context when none is given), top-p budgets after the fixed ones."""
    if budget.startswith("p"):
        return 2.0 + float(budget[1:].split(":")[0])
    try:
        return float(Fraction(budget))
    except (ValueError, ZeroDivisionError):
        pass
    tokens = float(budget[:-1]) * 1024 if budget.endswith("K") else float(budget)
    return tokens / (length or 1 << 20)


def length_label(tokens):
    """1024 -> 1K, 32768 -> 32K, 1536 -> 1.5K, 500 -> 500."""
    tokens = int(tokens)
    if tokens >= 1 << 20 and tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens >= 1024:
        k = tokens / 1024
        return f"{k:g}K"
    return str(tokens)


def wilson(mean, n, z=1.959963984540054):
    """95 % Wilson interval of a mean score over n samples (the CLI's, tools/masskv/eval.cpp)."""
    if n <= 0 or math.isnan(mean):
        return 0.0, 1.0
    z2 = z * z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(max(0.0, mean * (1 - mean) / n + z2 / (4 * n * n)))
    return max(0.0, centre - half), min(1.0, centre + half)

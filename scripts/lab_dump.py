"""The one reader of `masskv dump` files (tools/masskv/qkv_dump.hpp) for the lab scripts
(selection_lab.py, indexer_lab.py): the header, the queries and the keys, as float64."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def read_dump(path: Path):
    """(header dict, q [steps][hq][d], k [ctx][hkv][d]); exits naming the file if damaged."""
    with open(path, "rb") as f:
        magic = f.read(8)
        if magic != b"MKVDUMP1":
            raise SystemExit(f"{path}: not a masskv dump (magic {magic!r})")
        (hlen,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(hlen))
        d, hq, hkv, ctx, steps = h["head_dim"], h["hq"], h["hkv"], h["context"], h["steps"]
        q = np.fromfile(f, dtype="<f4", count=steps * hq * d).reshape(steps, hq, d)
        k = np.fromfile(f, dtype="<f4", count=ctx * hkv * d).reshape(ctx, hkv, d)
    if k.shape[0] != ctx:
        raise SystemExit(f"{path}: truncated")
    return h, q.astype(np.float64), k.astype(np.float64)

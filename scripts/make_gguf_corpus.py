#!/usr/bin/env python3
"""Writes tests/data/gguf/: one small valid GGUF v3 file and one file per malformation.

Each malformed file is the valid file with exactly one thing broken, so a reader that accepts
the valid file and rejects the broken one has checked that thing. The files also seed the
fuzzer (scripts/fuzz.sh). Deterministic: rerunning rewrites identical bytes.
Layout per ggml's docs/gguf.md (little-endian throughout).
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
              U64: "Q", I64: "q", F64: "d"}
# ggml type id -> (block values, block bytes)
GGML = {0: (1, 4), 8: (32, 34), 12: (256, 144)}


def gstr(s, length=None):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def value_body(vtype, v):
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(value_body(etype, x) for x in items)
    return struct.pack("<" + SCALAR_FMT[vtype], v)


def kv(key, vtype, v):
    return gstr(key) + struct.pack("<I", vtype) + value_body(vtype, v)


def valid_kvs(alignment=32):
    return [
        kv("general.architecture", STRING, "llama"),
        kv("general.alignment", U32, alignment),
        kv("test.u8", U8, 200), kv("test.i8", I8, -5), kv("test.u16", U16, 60000),
        kv("test.i16", I16, -30000), kv("test.u32", U32, 4000000000),
        kv("test.i32", I32, -2000000000), kv("test.f32", F32, 1.5), kv("test.bool", BOOL, True),
        kv("test.u64", U64, 2**63 + 5), kv("test.i64", I64, -2**40), kv("test.f64", F64, -0.25),
        kv("test.string", STRING, "h\u00e9llo"),
        kv("test.array_i32", ARRAY, (I32, [1, -2, 3])),
        kv("test.array_str", ARRAY, (STRING, ["a", "bc", ""])),
        kv("test.array_bool", ARRAY, (BOOL, [True, False])),
        kv("test.nested", ARRAY, (ARRAY, [(U16, [1, 2]), (U16, [3])])),
    ]


# name, dims, ggml type
VALID_TENSORS = [("a", [4, 2], 0), ("b", [64, 2], 8), ("c", [256], 12)]


def tensor_bytes(dims, gtype):
    n = 1
    for d in dims:
        n *= d
    qk, nb = GGML[gtype]
    return n // qk * nb


def build(kvs=None, tensors=None, alignment=32, magic=b"GGUF", version=3, tensor_count=None,
          kv_count=None, offsets=None, raw_infos=None, data_extra=0):
    kvs = valid_kvs(alignment) if kvs is None else kvs
    tensors = VALID_TENSORS if tensors is None else tensors
    infos, off, sizes, offs = b"", 0, [], []
    for i, (name, dims, gtype) in enumerate(tensors):
        size = tensor_bytes(dims, gtype) if gtype in GGML else 32
        size = size if size <= 1 << 20 else 0  # forged sizes get no data
        o = offsets[i] if offsets and i in offsets else off
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(
            struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, o)
        offs.append(o)
        sizes.append(size)
        off += (size + alignment - 1) // alignment * alignment
    if raw_infos is not None:
        infos = raw_infos
    head = magic + struct.pack("<IQQ", version,
                               len(tensors) if tensor_count is None else tensor_count,
                               len(kvs) if kv_count is None else kv_count)
    body = head + b"".join(kvs) + infos
    body += b"\0" * ((-len(body)) % alignment)
    data = bytearray(off + data_extra)
    for i, (o, size) in enumerate(zip(offs, sizes)):  # deterministic non-zero tensor bytes
        for j in range(min(size, max(0, len(data) - o))):
            data[o + j] = (i * 31 + j * 7) % 251
    return body + bytes(data)


def corpus():
    valid = build()
    n_kv_bytes = len(b"".join(valid_kvs()))
    files = {
        "valid_small.gguf": valid,
        "truncated_header.gguf": valid[:10],
        "bad_magic.gguf": b"GGUX" + valid[4:],
        "unsupported_version.gguf": build(version=1),
        "huge_tensor_count.gguf": build(tensor_count=2**62),
        "huge_kv_count.gguf": build(kv_count=2**60),
        # the last metadata value claims a 1 MB string
        "string_past_eof.gguf": build(kvs=valid_kvs() + [gstr("test.long") + struct.pack(
            "<I", STRING) + gstr(b"xyz", length=1 << 20)], tensors=[]),
        "nested_array_overflow.gguf": build(kvs=valid_kvs() + [
            gstr("test.bad_nested") + struct.pack("<IIQ", ARRAY, ARRAY, 1) +
            struct.pack("<IQ", U32, 2**61)]),
        "unknown_value_type.gguf": build(kvs=valid_kvs() + [
            gstr("test.bad_type") + struct.pack("<II", 13, 0)]),
        "bad_bool.gguf": build(kvs=valid_kvs() + [gstr("test.bad_bool") + struct.pack(
            "<IB", BOOL, 7)]),
        "duplicate_key.gguf": build(kvs=valid_kvs() + [kv("test.u8", U8, 1)]),
        "ndims_gt4.gguf": build(tensors=VALID_TENSORS + [("e", [1, 1, 1, 1, 1], 0)]),
        "dim_product_overflow.gguf": build(tensors=VALID_TENSORS + [("big", [2**32, 2**32, 2**32],
                                                                     0)]),
        "misaligned_offset.gguf": build(offsets={1: 64 + 4}),
        "data_past_eof.gguf": build(offsets={2: 4096}),
        "unknown_type.gguf": build(tensors=VALID_TENSORS + [("u", [32], 99)]),
        "kquant_width_not_256.gguf": build(tensors=[("k", [640, 1], 12)]),
        "bad_alignment.gguf": build(alignment=48),
        "zero_alignment.gguf": build(kvs=[kv("general.alignment", U32, 0)], tensors=[]),
        # alignment 1 is legal: the f32 tensor lands at an address that is not float-aligned
        "valid_align1.gguf": build(alignment=1, tensors=[("b", [32, 1], 8), ("f", [17, 2], 0)]),
        "duplicate_tensor_name.gguf": build(tensors=VALID_TENSORS + [("b", [32], 0)]),
        "truncated_tensor_infos.gguf": valid[:24 + n_kv_bytes + 20],
    }
    return files


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "gguf")
    os.makedirs(out, exist_ok=True)
    for name, data in corpus().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(corpus())} files to {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Long-context retrieval prompts for training indexers (the learned-indexer issue, part 1): task
families, templates and haystack text that `masskv eval` does not use, written as JSON lines for
`masskv dump --prompts` (each prompt tokenized as written, no chat template; its answer's tokens
are the dumped queries: the positions right after a question, where a selector must retrieve).

    scripts/make_retrieval_prompts.py --haystack FILE[,FILE...] [--chars 7000,14000,24000]
        [--samples 2] [--seed 5] -o prompts.jsonl

Families (the eval's are key -> number/UUID needles in noise or the Debian Policy Manual, variable
chains, word counts, section titles):
  dock      one shipment record hidden in the text; asked which dock the crate left from
  code      eight room access codes (six letters) at random depths; one room asked
  roster    one person's three duties at three depths; all three asked, in order
  quote     a line of other text marked "remember"; asked to repeat it
  colour    two records per object (a colour, then a corrected colour later); the latest asked
The haystack is cut from the given files at random offsets (whole lines).
"""
from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

WORDS = ("amber basil cedar delta ember fjord garnet harbor indigo juniper kestrel lagoon maple "
         "nectar onyx pepper quartz raven saffron tundra umber violet walnut yarrow zephyr "
         "copper falcon meadow orchid pebble sparrow thistle willow").split()
PEOPLE = "Alma Bruno Chiara Dmitri Esther Farid Greta Hiro Ines Jonas Kalani Lior Mireille".split()
DUTIES = ("feeds the goats|checks the boiler|waters the ferns|sorts the mail|locks the gate|"
          "tunes the piano|sweeps the attic|counts the crates|repairs the fence").split("|")
COLOURS = "crimson teal ochre lilac charcoal ivory emerald cobalt saffron".split()
OBJECTS = "kettle bicycle umbrella lantern teapot canoe armchair typewriter".split()


def haystack(texts: list[str], chars: int, rng: random.Random) -> list[str]:
    """Whole lines of the haystack files, from a random offset, about `chars` characters."""
    src = texts[rng.randrange(len(texts))]
    lines = src.splitlines()
    start = rng.randrange(max(1, len(lines) - 50))
    out, n = [], 0
    i = start
    while n < chars:
        ln = lines[i % len(lines)]
        out.append(ln)
        n += len(ln) + 1
        i += 1
    return out


def insert(lines: list[str], facts: list[str], rng: random.Random, ordered: bool = True):
    """The facts at random line positions (in the given order when `ordered`)."""
    pos = sorted(rng.sample(range(1, len(lines)), len(facts)))
    if not ordered:
        rng.shuffle(pos)
    for p, f in sorted(zip(pos, facts), reverse=True):
        lines.insert(p, f)
    return lines


def make(family: str, texts, chars: int, rng: random.Random, other: list[str]):
    lines = haystack(texts, chars, rng)
    if family == "dock":
        crate = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        dock = str(rng.randrange(10, 99))
        insert(lines, [f"Shipment log: crate {crate} left from dock {dock} this morning."], rng)
        q, a = f"From which dock did crate {crate} leave?", dock
    elif family == "code":
        rooms = rng.sample(WORDS, 8)
        codes = ["".join(rng.choice(string.ascii_uppercase) for _ in range(6)) for _ in rooms]
        insert(lines, [f"(The access code of the {r} room is {c}.)" for r, c in zip(rooms, codes)],
               rng, ordered=False)
        i = rng.randrange(8)
        q, a = f"What is the access code of the {rooms[i]} room?", codes[i]
    elif family == "roster":
        who = rng.choice(PEOPLE)
        duties = rng.sample(DUTIES, 3)
        insert(lines, [f"Note for the roster: on {d} day {who} {x}." for d, x in
                       zip(("first", "second", "third"), duties)], rng)
        q, a = f"What are {who}'s three duties, in order?", "; ".join(duties)
    elif family == "quote":
        line = rng.choice([x for x in other if 40 <= len(x) <= 100])
        insert(lines, [f'Remember this line: "{line.strip()}"'], rng)
        q, a = "Repeat the line you were asked to remember.", line.strip()
    elif family == "colour":
        obj = rng.choice(OBJECTS)
        c1, c2 = rng.sample(COLOURS, 2)
        insert(lines, [f"Inventory: the {obj} was painted {c1}.",
                       f"Correction to the inventory: the {obj} is now {c2}."], rng)
        q, a = f"What colour is the {obj} now?", c2
    else:
        raise SystemExit(f"unknown family {family}")
    prompt = "\n".join(lines) + f"\n\nQuestion: {q}\nAnswer:"
    return prompt, " " + a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--haystack", required=True, help="text files to cut the haystack from (comma-separated)")
    ap.add_argument("--chars", default="7000,14000,24000", help="prompt sizes in characters")
    ap.add_argument("--families", default="dock,code,roster,quote,colour")
    ap.add_argument("--samples", type=int, default=2, help="prompts per family and size")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    files = [Path(x) for x in a.haystack.split(",") if x]
    for f in files:
        if not f.is_file():
            ap.error(f"--haystack: no such file: {f}")
    texts = [f.read_text(errors="replace") for f in files]
    other = [ln for t in texts for ln in t.splitlines()]
    sizes = [int(x) for x in a.chars.split(",")]
    if a.samples < 1 or any(s < 1000 for s in sizes):
        ap.error("--samples must be >= 1 and every --chars >= 1000")
    rng = random.Random(a.seed)
    n = 0
    with open(a.out, "w") as out:
        for fam in a.families.split(","):
            for size in sizes:
                for i in range(a.samples):
                    prompt, answer = make(fam, texts, size, rng, other)
                    out.write(json.dumps(dict(name=f"{fam}-{size}-{i}", prompt=prompt,
                                              answer=answer)) + "\n")
                    n += 1
    print(f"wrote {a.out}: {n} prompts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks the examples at the end of one masskv command's --help (docs/cli.md): there are 2 or 3,
each names only options its command has, and each passes the command's option checks (run with
--help appended: CLI11 checks the given values and refuses old spellings before it prints help,
so nothing runs). Prints "examples ok" or the first problem and exits 1.
    tests/cli/help_examples.py path/to/masskv bench attn
"""
import re
import shlex
import subprocess
import sys

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_of(binary, words):
    out = subprocess.run([binary, *words, "--help"], capture_output=True, text=True).stdout
    options, _, examples = out.partition("Examples:")
    return set(OPTION.findall(options)), examples.strip().splitlines()


def main():
    binary, words = sys.argv[1], sys.argv[2:]
    _, examples = help_of(binary, words)
    if not 2 <= len(examples) <= 3:
        sys.exit(f"{' '.join(words)}: {len(examples)} examples, want 2 or 3")
    for line in examples:
        # "masskv eval   (the quick suite)": a note after two spaces and "(" is not arguments.
        args = shlex.split(re.split(r"\s{2,}\(", line.strip())[0])[1:]
        sub = []
        for a in args:  # the subcommand words: the leading non-option arguments
            if a.startswith("-"):
                break
            sub.append(a)
        names, _ = help_of(binary, sub)
        unknown = [a.split("=")[0] for a in args
                   if re.match(r"--?[A-Za-z]", a) and a.split("=")[0] not in names]
        if unknown:
            sys.exit(f"{line.strip()}: {unknown} are not options of masskv {' '.join(sub)}")
        r = subprocess.run([binary, *args, "--help"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{line.strip()}: {r.stderr.strip()}")
    print("examples ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Counts a few code-health figures over the workspace's library and binary sources.

Reads crates/**/src/**/*.rs (not tests/ folders, not #[cfg(test)] modules or #[test]
functions) and prints, per crate and in total:

- non-test functions (fn items with a body), and those over 70 and over 100 lines
  (file:line and length, counted from the `fn` line to the closing brace);
- assert!/assert_eq!/assert_ne! (not debug_assert) in non-test code, per crate and per
  function;
- `.expect(` in non-test library code (not src/main.rs, not src/bin/);
- `Level::` outside crates/engine/layout;
- matches on the parity Option in the array crate (`parity.is_some()`,
  `parity.is_none()`, `if let Some(x) = ...parity`).

The parser is a tokenizer that knows strings (plain, raw, byte), chars, lifetimes and
comments (line, nested block), then counts braces to find fn bodies. It is a measuring
tool, not a Rust parser: macro bodies are read as ordinary tokens.

Usage: tools/code-counts.py [--root DIR] [--json] [--list-asserts]
"""

import argparse
import json
import os
import re
import sys
from collections import defaultdict

LONG = 70
VERY_LONG = 100
ASSERT_MACROS = {"assert", "assert_eq", "assert_ne"}


class Tok:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind = kind  # "id", "p" (punctuation), "str", "char", "life", "num"
        self.text = text
        self.line = line

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.line}"


def tokenize(src):
    """Splits Rust source into tokens; comments are dropped, literals kept whole."""
    toks = []
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += src[i] == "\n"
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(src, i)) and (
            i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = src.find(end, m.end())
            j = n if j < 0 else j + len(end)
            toks.append(Tok("str", src[i:j], line))
            line += src.count("\n", i, j)
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            toks.append(Tok("str", src[i:j], line))
            line += src.count("\n", i, j)
            i = j
        elif c == "'" or (c == "b" and src.startswith("b'", i)):
            k = i + (1 if c == "b" else 0)
            # A char literal: 'x', '\n', '\u{..}'; otherwise a lifetime or label.
            m = re.compile(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'").match(src, k)
            if m:
                toks.append(Tok("char", src[i : m.end()], line))
                i = m.end()
            else:
                m = re.compile(r"'[A-Za-z_][A-Za-z0-9_]*").match(src, i)
                if m:
                    toks.append(Tok("life", m.group(0), line))
                    i = m.end()
                else:
                    toks.append(Tok("p", c, line))
                    i += 1
        elif c.isalpha() or c == "_":
            m = re.compile(r"[A-Za-z0-9_]+").match(src, i)
            toks.append(Tok("id", m.group(0), line))
            i = m.end()
        elif c.isdigit():
            m = re.compile(r"[0-9][0-9A-Za-z_]*(\.[0-9][0-9A-Za-z_]*)?").match(src, i)
            toks.append(Tok("num", m.group(0), line))
            i = m.end()
        elif src.startswith("::", i):
            toks.append(Tok("p", "::", line))
            i += 2
        else:
            toks.append(Tok("p", c, line))
            i += 1
    return toks


def matching(toks, i):
    """Index of the token closing the bracket at toks[i]."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    open_, close = toks[i].text, pairs[toks[i].text]
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "p":
            continue
        if t.text == open_:
            depth += 1
        elif t.text == close:
            depth -= 1
            if depth == 0:
                return j
    return len(toks) - 1


def attribute_is_test(toks, i, j):
    """Whether the attribute toks[i..=j] (`#[...]`) is #[test] or a cfg that needs test."""
    body = [t.text for t in toks[i + 2 : j]]
    if body == ["test"] or (len(body) >= 3 and body[-2:] == ["::", "test"] and len(body) == 3):
        return True
    if body[:1] == ["cfg"] and "test" in body and "not" not in body:
        return True
    return False


def item_end(toks, i):
    """Index of the last token of the item starting at toks[i] (its `}` or `;`)."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j]
        if t.kind != "p":
            continue
        if t.text in "([":
            depth += 1
        elif t.text in ")]":
            depth -= 1
        elif t.text == "{" and depth == 0:
            return matching(toks, j)
        elif t.text == ";" and depth == 0:
            return j
    return len(toks) - 1


class Function:
    def __init__(self, name, path, line, end_line):
        self.name = name
        self.path = path
        self.line = line
        self.end_line = end_line
        self.asserts = 0

    @property
    def length(self):
        return self.end_line - self.line + 1


def analyse_file(path, rel, src):
    """Returns (functions, asserts outside functions, expects, levels, parity matches, test mods)."""
    toks = tokenize(src)
    skip = [False] * len(toks)  # tokens inside test-only items
    test_mods = []  # names of `#[cfg(test)] mod x;` declared in this file
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "p" and t.text == "#" and i + 1 < len(toks) and toks[i + 1].text == "[":
            j = matching(toks, i + 1)
            if attribute_is_test(toks, i, j):
                # Skip further attributes, then the item they belong to.
                k = j + 1
                while k < len(toks) and toks[k].text == "#" and k + 1 < len(toks) and toks[k + 1].text == "[":
                    k = matching(toks, k + 1) + 1
                end = item_end(toks, k)
                words = [x.text for x in toks[k : min(end + 1, k + 6)]]
                if "mod" in words and toks[end].text == ";":
                    test_mods.append(words[words.index("mod") + 1])
                for x in range(i, end + 1):
                    skip[x] = True
                i = end + 1
                continue
            i = j + 1
            continue
        i += 1

    functions = []
    stack = []  # (function, index of its closing brace)
    loose_asserts = 0
    expects = 0
    levels = 0
    i = 0
    while i < len(toks):
        while stack and i > stack[-1][1]:
            stack.pop()
        t = toks[i]
        if skip[i]:
            i += 1
            continue
        if t.kind == "id" and t.text == "fn" and i + 1 < len(toks) and toks[i + 1].kind == "id":
            # Find the body: the first `{` outside parens/brackets, or `;` (no body).
            depth = 0
            j = i + 2
            while j < len(toks):
                x = toks[j]
                if x.kind == "p":
                    if x.text in "([":
                        depth += 1
                    elif x.text in ")]":
                        depth -= 1
                    elif depth == 0 and x.text in "{;":
                        break
                j += 1
            if j < len(toks) and toks[j].text == "{":
                close = matching(toks, j)
                f = Function(toks[i + 1].text, rel, t.line, toks[close].line)
                functions.append(f)
                stack.append((f, close))
                i = j + 1
                continue
        if t.kind == "id" and t.text in ASSERT_MACROS and i + 1 < len(toks) and toks[i + 1].text == "!":
            if i == 0 or toks[i - 1].text != "::" or (i >= 2 and toks[i - 2].text in ("std", "core")):
                if stack:
                    stack[-1][0].asserts += 1
                else:
                    loose_asserts += 1
        if t.kind == "p" and t.text == "." and i + 2 < len(toks):
            if toks[i + 1].text == "expect" and toks[i + 2].text == "(":
                expects += 1
        if t.kind == "id" and t.text == "Level" and i + 1 < len(toks) and toks[i + 1].text == "::":
            levels += 1
        i += 1

    # Parity-Option matches: on the source with comments and literals taken out.
    code = " ".join(t.text if t.kind not in ("str", "char") else '""' for k, t in enumerate(toks) if not skip[k])
    parity = len(re.findall(r"\bparity\s*\.\s*is_(some|none)\s*\(\s*\)", code))
    parity += len(
        re.findall(r"\blet\s+Some\s*\([^=;{}]*\)\s*=\s*(?:&\s*(?:mut\s+)?)?(?:\w+\s*\.\s*)*parity\s*(?:\.\s*as_(?:ref|mut)\s*\(\s*\)\s*)?(?:\{|else\b)", code)
    )
    return functions, loose_asserts, expects, levels, parity, test_mods


def crate_of(rel):
    parts = rel.split("/")
    idx = parts.index("src")
    return "/".join(parts[1:idx])


def collect(root):
    files = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "crates")):
        dirnames[:] = sorted(d for d in dirnames if d not in ("tests", "target", "benches", "examples"))
        rel_dir = os.path.relpath(dirpath, root)
        if "src" not in rel_dir.split(os.sep):
            continue
        for name in sorted(filenames):
            if name.endswith(".rs"):
                files.append(os.path.join(rel_dir, name).replace(os.sep, "/"))
    return files


def module_file_candidates(rel, name):
    """Where a `mod name;` declared in file rel lives."""
    d, base = os.path.split(rel)
    if base in ("mod.rs", "lib.rs", "main.rs"):
        parent = d
    else:
        parent = os.path.join(d, base[:-3])
    return [os.path.join(parent, name + ".rs"), os.path.join(parent, name, "mod.rs")]


def measure(root):
    files = collect(root)
    results = {}
    test_files = set()
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            src = f.read()
        results[rel] = analyse_file(os.path.join(root, rel), rel, src)
        for m in results[rel][5]:
            for cand in module_file_candidates(rel, m):
                test_files.add(cand.replace(os.sep, "/"))
    # A test module's file and everything below its folder is test code.
    def is_test_file(rel):
        if rel in test_files:
            return True
        for tf in test_files:
            if tf.endswith("/mod.rs") and rel.startswith(tf[: -len("mod.rs")]):
                return True
            if rel.startswith(tf[:-3] + "/"):
                return True
        return False

    crates = defaultdict(lambda: {"functions": 0, "over70": 0, "over100": 0, "asserts": 0, "expects": 0, "levels": 0, "parity": 0})
    long_fns = []
    assert_fns = []
    for rel in files:
        if is_test_file(rel):
            continue
        functions, loose, expects, levels, parity, _ = results[rel]
        c = crates[crate_of(rel)]
        c["functions"] += len(functions)
        c["asserts"] += loose + sum(f.asserts for f in functions)
        library = not (rel.endswith("/src/main.rs") or "/src/bin/" in rel)
        if library:
            c["expects"] += expects
        if not rel.startswith("crates/engine/layout/"):
            c["levels"] += levels
        if rel.startswith("crates/engine/array/"):
            c["parity"] += parity
        for f in functions:
            if f.length > LONG:
                c["over70"] += 1
                long_fns.append(f)
            if f.length > VERY_LONG:
                c["over100"] += 1
            if f.asserts:
                assert_fns.append(f)
    long_fns.sort(key=lambda f: -f.length)
    assert_fns.sort(key=lambda f: (f.path, f.line))
    total = {k: sum(c[k] for c in crates.values()) for k in ("functions", "over70", "over100", "asserts", "expects", "levels", "parity")}
    return {
        "crates": {k: crates[k] for k in sorted(crates)},
        "total": total,
        "asserts_per_function": round(total["asserts"] / max(total["functions"], 1), 3),
        "long_functions": [{"at": f"{f.path}:{f.line}", "name": f.name, "lines": f.length} for f in long_fns],
        "functions_with_asserts": [{"at": f"{f.path}:{f.line}", "name": f.name, "asserts": f.asserts} for f in assert_fns],
    }


def print_table(r, list_asserts):
    cols = [("functions", "fns"), ("over70", ">70"), ("over100", ">100"), ("asserts", "assert"), ("expects", "expect"), ("levels", "Level::"), ("parity", "parity?")]
    w = max(len(k) for k in r["crates"]) + 2
    print("crate".ljust(w) + "".join(h.rjust(9) for _, h in cols))
    for name, c in r["crates"].items():
        print(name.ljust(w) + "".join(str(c[k]).rjust(9) for k, _ in cols))
    print("total".ljust(w) + "".join(str(r["total"][k]).rjust(9) for k, _ in cols))
    print(f"\nasserts per function: {r['asserts_per_function']}")
    print(f"\nfunctions over {LONG} lines ({len(r['long_functions'])}):")
    for f in r["long_functions"]:
        print(f"  {f['lines']:4d}  {f['at']}  {f['name']}")
    if list_asserts:
        print("\nasserts per function:")
        for f in r["functions_with_asserts"]:
            print(f"  {f['asserts']:3d}  {f['at']}  {f['name']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--list-asserts", action="store_true", help="also list the functions holding asserts")
    a = ap.parse_args()
    r = measure(os.path.abspath(a.root))
    if a.json:
        json.dump(r, sys.stdout, indent=1)
        print()
    else:
        print_table(r, a.list_asserts)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds the evaluation texts of scripts/robust.sh from files already on a Debian machine, one
file per kind of text, and prints which files went into each (a Markdown list).

Each kind: the candidate files in sorted path order (files under 1 KB or over 400 KB skipped),
concatenated with a blank line between them until the text holds at least --chars characters.
Kinds (CALIBRATION: choices may be made on them; HELD OUT: never used for a choice):
  legal      CALIBRATION  /usr/share/common-licenses/* except GPL-3 (and GPL, its link), which
                          earlier results used as held-out text
  code       HELD OUT     Python standard-library sources, /usr/lib/python3*/*.py
  markup     HELD OUT     Markdown, reStructuredText and HTML under /usr/share/doc (raw markup)
  changelog  HELD OUT     Debian changelogs, /usr/share/doc/*/changelog*.gz (decompressed)
Stories (CALIBRATION) are TinyStories windows of the shared text, not built here.
Usage: robust_texts.py OUT_DIR [--chars N]
"""
import argparse
import glob
import gzip
import os
import sys


def candidates(kind):
    if kind == "legal":
        paths = sorted(glob.glob("/usr/share/common-licenses/*"))
        return [p for p in paths if os.path.basename(p) not in ("GPL-3", "GPL")]
    if kind == "code":
        return sorted(glob.glob("/usr/lib/python3*/*.py"))
    if kind == "markup":
        out = []
        for ext in ("md", "rst", "html"):
            out += glob.glob(f"/usr/share/doc/**/*.{ext}", recursive=True)
        return sorted(out)
    if kind == "changelog":
        return sorted(glob.glob("/usr/share/doc/*/changelog*.gz"))
    raise ValueError(kind)


def read(path):
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return raw.decode("utf-8", errors="replace")


def build(kind, chars):
    text, used = [], []
    total = 0
    for p in candidates(kind):
        if not os.path.isfile(p) or os.path.islink(p) and os.path.realpath(p) in used:
            continue
        size = os.path.getsize(p)
        if size < 1024 or size > 400 * 1024:
            continue
        t = read(p).strip()
        text.append(t)
        used.append(p)
        total += len(t)
        if total >= chars:
            break
    return "\n\n".join(text) + "\n", used


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--chars", type=int, default=120000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for kind in ("legal", "code", "markup", "changelog"):
        text, used = build(kind, a.chars)
        with open(os.path.join(a.out, f"{kind}.txt"), "w") as f:
            f.write(text)
        print(f"- **{kind}** ({len(text)} characters, {len(used)} files): " + ", ".join(f"`{u}`" for u in used))
    return 0


if __name__ == "__main__":
    sys.exit(main())

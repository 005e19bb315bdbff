#!/usr/bin/env python3
"""depthkv's tokenizer against llama.cpp's (the reference) and Hugging Face's on one GGUF file.

Every case is tokenized by all three: depthkv (`depthkv tokenize --text-file F --json`, with
--no-bos / --special as the case asks), llama.cpp through llama-cpp-python
(`Llama(model_path, vocab_only=True).tokenize(bytes, add_bos=..., special=...)`), and, when
--hf-python names a Python with transformers and gguf, Hugging Face's tokenizer built from the
same GGUF file (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, run in that interpreter by
this script's --hf-worker mode, since it usually lives in another virtual environment).

The cases: real text of several kinds (licences, Python source, a plain-text manual, the
gnupg help texts in German, Russian, Japanese and Chinese, TinyStories; files already on a
Debian machine plus ../shared), and short edge cases (digit runs, whitespace runs, Unicode
letters, number symbols and marks, emoji, contractions, code, control-token text with and
without --special, BOS as the vocabulary asks). Real texts and edge cases are tokenized without
BOS unless the case says otherwise.

Prints a Markdown table: kind, case, characters, the number of ids of each tool, whether
depthkv's ids equal llama.cpp's and HF's (yes/no, n/a where a tool could not run the case), and
for a difference the first differing id position with both ids and the text there; then a
summary per kind. --golden-out writes {case: {"text", "bos", "special", "llama_cpp": ids}} as
JSON (the ids llama.cpp gave), the source of the golden ids of tests/llama/real_vocab_test.cpp.

  tokenizer_parity.py --model M.gguf [--depthkv build/release/tools/depthkv]
                      [--hf-python /path/to/python] [--shared ../shared] [--golden-out F.json]

Needs llama-cpp-python in the interpreter that runs it (its version is printed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (kind, name, path, max characters or None for the whole file); paths relative to --shared
# start with "shared:".
REAL_TEXTS = [
    ("legal", "GPL-3", "/usr/share/common-licenses/GPL-3", None),
    ("legal", "Apache-2.0", "/usr/share/common-licenses/Apache-2.0", None),
    ("code", "argparse.py", "/usr/lib/python3.11/argparse.py", None),
    ("doc", "git-subtree.txt", "/usr/share/doc/git/contrib/subtree/git-subtree.txt", None),
    ("multilingual", "gnupg help.de", "/usr/share/gnupg/help.de.txt", None),
    ("multilingual", "gnupg help.ru", "/usr/share/gnupg/help.ru.txt", None),
    ("multilingual", "gnupg help.ja", "/usr/share/gnupg/help.ja.txt", None),
    ("multilingual", "gnupg help.zh_CN", "/usr/share/gnupg/help.zh_CN.txt", None),
    ("stories", "TinyStories first 20K chars", "shared:text/tinystories_valid.txt", 20000),
]

# (kind, name, text, bos, special); text is str, or bytes for invalid UTF-8 (HF: n/a).
EDGE_CASES = [
    ("digits", "1", "1", False, False),
    ("digits", "12", "12", False, False),
    ("digits", "123", "123", False, False),
    ("digits", "1234567", "1234567", False, False),
    ("digits", "3.14159", "3.14159", False, False),
    ("digits", "1,000,000", "1,000,000", False, False),
    ("digits", "space + number", "pay 42 or 1000 dollars", False, False),
    ("digits", "mixed", "x1y22z333 v2.0.1 2024-03-15 10:30pm", False, False),
    ("whitespace", "two spaces", "a  b", False, False),
    ("whitespace", "eight spaces", "a        b", False, False),
    ("whitespace", "tabs", "a\tb\t\tc", False, False),
    ("whitespace", "newlines", "a\nb\n\nc\n\n\nd", False, False),
    ("whitespace", "CRLF", "line one\r\nline two\r\n", False, False),
    ("whitespace", "mixed", "x \t \n  \n\t y", False, False),
    ("whitespace", "trailing spaces", "end   ", False, False),
    ("whitespace", "trailing newlines", "end\n\n\n", False, False),
    ("whitespace", "only spaces", "     ", False, False),
    ("whitespace", "leading spaces", "   lead", False, False),
    ("whitespace", "indented code", "def f():\n    if x:\n        return 1\n", False, False),
    ("whitespace", "NBSP, NEL, ideographic", "a\u00a0b\u0085c\u3000d\u2009e", False, False),
    ("whitespace", "long runs", "a" + " " * 40 + "b" + "\n" * 40 + "c" + "\t" * 35 + "d", False, False),
    ("whitespace", "control characters", "a\x04b\x1dc\x13d\x7fe", False, False),
    ("whitespace", "NUL byte", "a\x00b", False, False),
    ("unicode", "accents", "café naïve résumé Ångström façade", False, False),
    ("unicode", "combining marks", "cafe\u0301 a\u0308 n\u0303 Z\u0324\u0354\u0367a\u0308\u0356", False, False),
    ("unicode", "CJK", "你好，世界。日本語のテキストです。", False, False),
    ("unicode", "Korean", "안녕하세요 세계", False, False),
    ("unicode", "Cyrillic, Greek", "Привет, мир! Καλημέρα κόσμε", False, False),
    ("unicode", "Arabic, Hebrew", "مرحبا بالعالم שלום עולם", False, False),
    ("unicode", "Devanagari, Thai", "नमस्ते दुनिया สวัสดีครับ", False, False),
    ("unicode", "emoji", "I ❤️ 🍕🎉 👍🏽!", False, False),
    ("unicode", "ZWJ sequences", "👨‍👩‍👧‍👦 🏳️‍🌈 👩🏽‍💻", False, False),
    ("unicode", "math symbols", "∀x∈ℝ: x≥0 → √x ∑ ∞", False, False),
    ("unicode", "planes 1-2 (F0, F1, F2 leads)", "x\U0001F600\U00040000\U00080001y", False, False),
    ("numbers", "Ⅻ ① ½", "Ⅻ ① ½", False, False),
    ("numbers", "superscripts", "x² + y³ = z¹⁰", False, False),
    ("numbers", "subscripts", "H₂O CO₂", False, False),
    ("numbers", "fractions", "¼ ¾ ⅓ ⅞ of it", False, False),
    ("numbers", "Roman numerals", "Ⅰ Ⅱ Ⅲ ⅳ Chapter Ⅻ", False, False),
    ("numbers", "circled", "①②③ ⑩ ⑳", False, False),
    ("numbers", "other digits", "٣٤٥ १२३ １２３ 〇", False, False),
    ("numbers", "letters + numbers", "Ⅻth ½cup x²y", False, False),
    ("contractions", "lower case", "it's don't you're we've I'm we'll he'd", False, False),
    ("contractions", "upper case", "IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D", False, False),
    ("contractions", "I'M", "I'M", False, False),
    ("contractions", "mixed case", "It'S dOn'T yOu'Re", False, False),
    ("contractions", "quotes", "'s alone, rock 'n' roll, O'Neil's '", False, False),
    ("contractions", "curly apostrophe", "it\u2019s don\u2019t", False, False),
    ("code", "C", "if (a!=b&&c<=d) { x += y->z[0]; }", False, False),
    ("code", "URL", "https://example.com/a?b=c&d=e#f", False, False),
    ("code", "HTML", "<div><p>Hi</p><br></div>\n<table><tr><td>1</td></tr></table>", False, False),
    ("special", "chat text, --special", "<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn>"
     "<|endoftext|>", False, True),
    ("special", "chat text, plain", "<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn>"
     "<|endoftext|>", False, False),
    ("special", "BOS as the vocabulary asks", "Hello world", True, False),
    ("special", "empty", "", False, False),
    ("bytes", "invalid UTF-8", b"ok \xff\xfe bad \xc3( end", False, False),
]


def load_cases(shared):
    cases = []
    for kind, name, path, limit in REAL_TEXTS:
        p = os.path.join(shared, path[len("shared:"):]) if path.startswith("shared:") else path
        if not os.path.exists(p):
            print(f"tokenizer_parity.py: skipping {name}: {p} is missing", file=sys.stderr)
            continue
        with open(p, encoding="utf-8") as f:
            text = f.read()
        if limit is not None:
            text = text[:limit]
        cases.append({"kind": kind, "name": name, "text": text, "bos": False, "special": False})
    for kind, name, text, bos, special in EDGE_CASES:
        cases.append({"kind": kind, "name": name, "text": text, "bos": bos, "special": special})
    return cases


def as_bytes(text):
    return text if isinstance(text, bytes) else text.encode("utf-8")


def depthkv_ids(cli, model, cases):
    """One depthkv run per (bos, special) group: one JSON line per --text-file."""
    out = [None] * len(cases)
    with tempfile.TemporaryDirectory() as tmp:
        groups = {}
        for i, c in enumerate(cases):
            groups.setdefault((c["bos"], c["special"]), []).append(i)
        for (bos, special), idx in groups.items():
            cmd = [cli, "tokenize", "-m", model, "--json"]
            if not bos:
                cmd.append("--no-bos")
            if special:
                cmd.append("--special")
            for i in idx:
                path = os.path.join(tmp, f"{i}.txt")
                with open(path, "wb") as f:
                    f.write(as_bytes(cases[i]["text"]))
                cmd += ["--text-file", path]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0:
                lines = r.stdout.splitlines()
                if len(lines) != len(idx):
                    sys.exit(f"tokenizer_parity.py: depthkv printed {len(lines)} lines for {len(idx)} files")
                for i, line in zip(idx, lines):
                    out[i] = json.loads(line)
                continue
            for i in idx:  # a failure: each file on its own, a failing one gives its message
                one = cmd[:cmd.index("--text-file")] + ["--text-file", os.path.join(tmp, f"{i}.txt")]
                r = subprocess.run(one, capture_output=True, text=True)
                out[i] = json.loads(r.stdout) if r.returncode == 0 else r.stderr.strip() or f"exit {r.returncode}"
    return out


def llama_cpp_ids(model, cases):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    out = []
    for c in cases:
        data = as_bytes(c["text"])
        out.append(list(llm.tokenize(data, add_bos=c["bos"], special=c["special"])) if data or c["bos"] else [])
    return out, llm, llama_cpp.__version__


def hf_worker(model, cases_json, out_json):
    """Runs in the HF interpreter: ids (or None for bytes cases) per case."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer
    import transformers
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(model)), gguf_file=os.path.basename(model))
    with open(cases_json, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for c in cases:
        if c["text"] is None:
            out.append(None)
            continue
        out.append(tok.encode(c["text"], add_special_tokens=c["bos"], split_special_tokens=not c["special"]))
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"version": transformers.__version__, "ids": out}, f)


def hf_ids(hf_python, model, cases):
    with tempfile.TemporaryDirectory() as tmp:
        cj, oj = os.path.join(tmp, "cases.json"), os.path.join(tmp, "ids.json")
        with open(cj, "w", encoding="utf-8") as f:
            json.dump([{"text": None if isinstance(c["text"], bytes) else c["text"], "bos": c["bos"],
                        "special": c["special"]} for c in cases], f)
        subprocess.run([hf_python, os.path.abspath(__file__), "--hf-worker", model, cj, oj], check=True)
        with open(oj, encoding="utf-8") as f:
            r = json.load(f)
    return r["ids"], r["version"]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def where(llm, ref, i):
    """The text around id position i of the reference ids (llama.cpp's detokenization)."""
    pre = llm.detokenize(ref[max(0, i - 3):i]).decode("utf-8", "replace")
    at = llm.detokenize(ref[i:i + 3]).decode("utf-8", "replace")
    return json.dumps(pre[-12:] + "|" + at[:12], ensure_ascii=False)


def cell(ours, ref):
    if ref is None:
        return "n/a"
    if isinstance(ours, str):
        return "no (error)"
    return "yes" if ours == ref else "no"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--depthkv", default=os.path.join(ROOT, "build/release/tools/depthkv"))
    ap.add_argument("--hf-python", help="a Python with transformers + gguf; HF is left out without it")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--golden-out")
    ap.add_argument("--hf-worker", nargs=3, metavar=("MODEL", "CASES_JSON", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        hf_worker(*args.hf_worker)
        return
    if not args.model:
        ap.error("--model is required")

    cases = load_cases(args.shared)
    ours = depthkv_ids(args.depthkv, args.model, cases)
    ref, llm, llama_version = llama_cpp_ids(args.model, cases)
    hf, hf_version = (hf_ids(args.hf_python, args.model, cases) if args.hf_python else ([None] * len(cases), None))

    print(f"Model: `{os.path.basename(args.model)}`; llama-cpp-python {llama_version}"
          + (f"; transformers {hf_version}" if hf_version else "; HF not compared") + ".\n")
    print("| kind | case | characters | ids depthkv | ids llama.cpp | ids HF | = llama.cpp | = HF | first difference |")
    print("|---|---|---:|---:|---:|---:|---|---|---|")
    summary = {}
    for c, o, r, h in zip(cases, ours, ref, hf):
        chars = len(c["text"]) if isinstance(c["text"], str) else f"{len(c['text'])} bytes"
        diffs = []
        if isinstance(o, str):  # depthkv failed: its message
            diffs.append("depthkv failed: " + o.replace("\n", " "))
        for label, other in (("llama.cpp", r), ("HF", h)):
            if other is None or other == o or isinstance(o, str):
                continue
            i = first_diff(o, other)
            ctx = where(llm, r if label == "llama.cpp" else o, i)
            got = o[i] if i < len(o) else "end"
            want = other[i] if i < len(other) else "end"
            diffs.append(f"{label} at id {i}: depthkv {got}, {label} {want}, near {ctx}")
        name = c["name"] + (" (BOS)" if c["bos"] else "")
        if c["special"] and "special" not in c["name"]:
            name += " (--special)"
        n_ours = "error" if isinstance(o, str) else len(o)
        print(f"| {c['kind']} | {name} | {chars} | {n_ours} | {len(r)} | {'-' if h is None else len(h)} | "
              f"{cell(o, r)} | {cell(o, h)} | {'; '.join(diffs).replace('|', '&#124;')} |")
        s = summary.setdefault(c["kind"], [0, 0, 0, 0, 0])
        s[0] += 1
        s[1] += o == r
        s[2] += h is not None and o == h
        s[3] += h is not None
        s[4] += len(r)
    print("\n| kind | cases | llama.cpp ids | depthkv = llama.cpp | depthkv = HF |")
    print("|---|---:|---:|---:|---:|")
    tot = [0, 0, 0, 0, 0]
    for kind, s in summary.items():
        tot = [a + b for a, b in zip(tot, s)]
        print(f"| {kind} | {s[0]} | {s[4]} | {s[1]}/{s[0]} | " + (f"{s[2]}/{s[3]}" if s[3] else "n/a") + " |")
    print(f"| all | {tot[0]} | {tot[4]} | {tot[1]}/{tot[0]} | " + (f"{tot[2]}/{tot[3]}" if tot[3] else "n/a") + " |")

    if args.golden_out:
        with open(args.golden_out, "w", encoding="utf-8") as f:
            json.dump({c["name"]: {"text": c["text"] if isinstance(c["text"], str) else list(c["text"]),
                                   "bos": c["bos"], "special": c["special"], "llama_cpp": r}
                       for c, r in zip(cases, ref)}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()

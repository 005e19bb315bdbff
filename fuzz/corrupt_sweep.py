#!/usr/bin/env python3
"""Seeded corruption sweep of the depthkv program over every input kind (standard library only).

Not run in CI. Each case writes a corrupted input (or picks a bad command-line value), runs one
`depthkv` subcommand on it with small settings, and checks the run against what the case expects.

Expected outcome of a case (`expect`; counts per kind in the second table):
  same      the mutation provably does not matter: exit 0 with exactly the stdout and output files
            of the same command on the unmutated input (run once per command and input, cached;
            the case folder's path and the timing lines "time: ...", "cost: ..." and analyze's
            JSON "seconds" normalized). Neutral mutations: profile JSON re-indented / other white
            space, object keys reordered, an unknown key added (profile_io.hpp looks keys up by
            name); token files separated by commas, tabs, CR LF, form feeds instead of spaces;
            GGUF: an unused metadata key added, the metadata reordered, padding bytes before the
            tensor data non-zero, `general.alignment` 32 (the default) or 64/256 with the data
            re-aligned (every tensor offset is a multiple), Gemma 3's default layer pattern given
            explicitly (`gemma3.attention.sliding_window_pattern`, five local layers then one
            global), its local RoPE base given as the default 10000, its sliding window widened
            beyond the run, an integer key rewritten with its own value. When the command refuses
            the unmutated input too (an infeasible budget), the case must be refused with the
            same message.
  refuse    must be refused (exit 1 with a message; the case says why). Where the case knows the
            culprit (a profile key, a GGUF key or tensor name), the message must name it (W10).
  property  a success must satisfy its subcommand's property (W9); a refusal is allowed:
            allocate  budgets (per layer, or per KV head) sum to the printed total; the total is
                      llround(keep x length x layers [x heads]) lowered to the caps' sum; every
                      budget lies in [min(cap, sinks + recent), cap], cap = the length or window - 1
                      on a sliding-window layer (the floor only without --preset)
            eval      (--json) finite numbers, KL >= 0, top-1 in [0, 1], kept <= full bytes, every
                      policy of one keep ratio spends the same total, no layer above the context
            perplexity (--json) finite NLL >= 0, ppl = exp(nll), nll = mean of the windows' NLL
            tokenize  every id an integer in [0, vocabulary size)
            generate  with --keep: no layer keeps more than the prompt (stderr "per-layer tokens");
                      greedy runs print no <unk> (W3: non-finite logits)
            profile   the written profile loads: `depthkv allocate --profile OUT --keep 1 --json`
                      succeeds and satisfies allocate's property
  any       refusal or success (analyze, perplexity/eval without --json): only the W rules.
Controls: every kind also runs --controls unmutated valid inputs (default 12, realgguf 8) with
expect `same`: each must succeed with the output of a second run (determinism) and its property.

Classes:
  clean          the program refused the input as expected: exit 1 (tools/depthkv.cpp: every error
                 exits 1) with "depthkv: error: <message>" on stderr
  success        exit 0 and every check below passed
  crash          killed by a signal (SIGSEGV, SIGABRT, ...), an exit code other than 0 and 1, or a
                 sanitizer / "terminate called" / assertion report on stderr whatever the exit code
  hang           still running after --timeout seconds (killed)
  wrong          wrong output: one of the rules W1-W7, W10
  wrong-answer   W8 (a `same` case whose output differs) or W9 (a success breaking its property)
  refused-valid  R: a control, a neutral (`same`) case or a known-valid input refused

Rules (each finding names the rule that fired):
  W1 accepted   exit 0 on an input the case marks as one that must be refused (the reason is in
                the case: e.g. a negative count, a truncated file, a NaN weight, /dev/full output,
                a directory or missing file as input, an id outside the vocabulary, a value
                outside an option's documented range)
  W2 non-finite exit 0 and stdout or a written output file holds nan, -nan, inf, -inf or null
                as a word (generate: case-sensitive, so a story's "Nan" is no finding)
  W3 unk        greedy `generate` (-t 0) printed "<unk>" (token 0): non-finite or degenerate
                logits; a trained model never picks it greedily
  W4 json       exit 0 with --json, but stdout is not strict JSON (NaN/Infinity refused); or an
                output JSON file (profile -o, eval --windows-out) is not strict JSON
  W5 empty      exit 0 but nothing on stdout, where the subcommand always prints something
  W6 no-message exit 1 without "depthkv: error: <non-empty message>" on stderr
  W7 misleading the error message blames an option that is not on the command line ("--flag:",
                "--flag must", "--flag is", "--flag =", "--flag outside", e.g. "--length must be
                >= 1" for a profile's length), or, for a missing / directory
                input given on the command line, does not name that path or names a quoted path
                the user never gave
  W8 answer     a `same` case's stdout or output file differs from the unmutated input's
  W9 property   a success breaks its subcommand's property (above)
  W10 unnamed   a refusal whose message names none of what the case knows was wrong
  R  refused    a valid input refused

Kinds (--kind, comma-separated; default all): profile, gguf, llama2c, tokens, text, cli (the small
models in ../shared), realgguf (SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M from
DEPTHKV_MODEL_DIR, default ~/.cache/depthkv/models: neutral metadata changes, metadata values,
tokenizer keys, Gemma 3's layer-pattern keys (sliding_window, sliding_window_pattern,
rope.freq_base_swa), tensor infos, tensor data (an F32 NaN/inf, quant bytes), truncation; run by
`tokenize -p` and `generate -i -n 8 -t 0 --threads 1`; the mutated file is written as its changed
header plus the original tensor data by copy_file_range), realprofile (docs/results/smollm2 and
gemma3 .profile.json and .best.profile.json: the profile mutations; run by allocate, and SmolLM2's
by a pruned `generate`), python (the Python package's API under bad input: fuzz/python_sweep.py's
seeded cases, run by --python, the interpreter that has depthkv, torch and transformers; its
valid controls are among its cases, its classes map to this table's: wrong and partial (an
object or cache changed by a refused call) count as wrong answers, a case that could not be
built as a crash). 1,000 cases per kind by default (--cases N, --quick: 150).
Reproducers of every non-clean case (the corrupted files, cmd.sh, stdout, stderr, case.json)
go to OUT/repro/<class>/<kind>-<index>/ (a model-sized file is not kept: cmd.sh names the
--replay to write it again); `--replay KIND:INDEX` (KIND:cINDEX: control INDEX) regenerates one
case (cases are a pure function of --seed, kind and index). OUT must lie outside the repository.
`--self-test` feeds the classifier runs of known verdicts (a wrong answer, a broken property, a
refused control, an unnamed refusal, an accepted must-refuse input) and fails unless each is
reported. `--json FILE` writes the table, the findings, every case's verdict and the commit (with
whether the tree was dirty, and whether the program changed during the sweep: then rerun);
`--md FILE` the tables and findings as markdown (fuzz/results/corrupt_sweep.{json,md}).

Timings (2-core machine, release build, --jobs 2): the default sweep (8 kinds x 1,000 cases +
92 controls) takes 5.5 to 9 minutes (idle or busy machine), realgguf 4 to 7 of them (Gemma 3 runs take 1.5-2 s;
--kind without realgguf: about 1.5 minutes). A sanitizer build (-DDEPTHKV_SANITIZE=ON) wants
--mem-mb 0 --timeout 40 and ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:
max_allocation_size_mb=4096 (an allocation the address-space limit would refuse then fails as
std::bad_alloc, not as a sanitizer report).

usage: corrupt_sweep.py [--bin PATH] [--data DIR] [--out DIR] [--seed N] [--kind K[,K]]
                        [--cases N | --quick] [--controls N] [--jobs J] [--timeout S]
                        [--json FILE] [--md FILE] [--replay K:I] [--self-test] [--python PY]
"""
import argparse
import hashlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

CONTROL = False  # (development) every case of every kind is a control (no corruption)
KINDS = ["profile", "gguf", "llama2c", "tokens", "text", "cli", "realgguf", "realprofile", "python"]
CLASSES = ["clean", "success", "crash", "hang", "wrong", "wrong-answer", "refused-valid"]
EXPECTS = ["same", "refuse", "property", "any"]
N_CONTROLS = {"realgguf": 8, "python": 0}  # control cases per kind (default 12), run in every sweep
DEFAULT_CASES = {"realgguf": 1000}  # cases per kind (default 1000)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
I32_MIN, I32_MAX = -(2 ** 31), 2 ** 31 - 1


class Case:
    """One run: files to write into the case folder, the command, and what is expected."""

    def __init__(self, kind, index, label):
        self.kind = kind
        self.index = index
        self.label = label          # mutation, e.g. "profile/truncate" (grouping key of findings)
        self.files = {}             # name -> bytes, written into the case folder
        self.dirs = []              # sub-folders to create
        self.argv = []              # after the program; "{D}" is replaced by the case folder
        self.must_refuse = None     # reason the input must be refused (rule W1), or None
        self.stdout_full = False    # stdout redirected to /dev/full
        self.expect_stdout = True   # rule W5
        self.outputs = []           # output files ("{D}/...") checked by W2/W4 on success
        self.json_outputs = []      # output files that must be strict JSON
        self.paths_in_msg = []      # W7: the message must name these (missing/directory inputs)
        self.timeout_scale = 1.0
        self.expect = None          # "same", "property" or "any"; "refuse" whenever must_refuse is set
        self.valid = False          # a valid input (control, neutral mutation): a refusal is refused-valid
        self.control = False        # an unmutated input of the kind's control set
        self.base_files = None      # expect "same": the unmutated files (name -> bytes or Spliced)
        self.refuse_names = []      # W10: a refusal's message must name one of these (case-insensitive)
        self.n_vocab = None         # tokenize property: ids must lie in [0, n_vocab)

    def refuse(self, reason, names=()):
        if self.must_refuse is None:
            self.must_refuse = reason
            self.refuse_names = [n for n in names if n]

    def same(self, base_files):
        """The mutation provably does not matter: exit 0 with the unmutated input's exact output."""
        self.expect = "same"
        self.valid = True
        self.base_files = dict(base_files)

    def expectation(self):
        if self.must_refuse:
            return "refuse"
        if self.expect:
            return self.expect
        return "property" if property_of(self) else "any"


class Spliced:
    """A large file written as segments: bytes, or (path, offset, length) copied from a file with
    copy_file_range (a 250 MB model per case is not held in memory)."""

    def __init__(self, segments):
        self.segments = segments

    def key(self):
        return tuple(("b", len(x), hash(x)) if isinstance(x, (bytes, bytearray)) else ("f",) + tuple(x)
                     for x in self.segments)

    def write(self, path):
        with open(path, "wb", buffering=0) as f:
            fo = f.fileno()
            for seg in self.segments:
                if isinstance(seg, (bytes, bytearray)):
                    mv = memoryview(seg)
                    while len(mv):
                        mv = mv[f.write(mv):]
                    continue
                src, off, n = seg
                with open(src, "rb") as g:
                    fi = g.fileno()
                    while n > 0:
                        k = os.copy_file_range(fi, fo, n, off)
                        if k <= 0:
                            break
                        off += k
                        n -= k


# ----------------------------------------------------------------------------------------------
# Base inputs (read once, shared read-only by all cases)
# ----------------------------------------------------------------------------------------------

class Base:
    def __init__(self, data, work, exe):
        self.data = data
        self.exe = exe
        m = os.path.join(data, "models")
        self.sbin = os.path.join(m, "stories260K", "stories260K.bin")
        self.stok = os.path.join(m, "stories260K", "tok512.bin")
        self.sgguf = os.path.join(m, "stories260K", "stories260K.gguf")
        self.abin = os.path.join(m, "aidreams260K", "aidreams260K.bin")
        self.atok = os.path.join(m, "aidreams260K", "tok512.bin")
        self.vocabs = {v: os.path.join(data, "vocab", "ggml-vocab-%s.gguf" % v)
                       for v in ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2"]}
        for p in [self.sbin, self.stok, self.sgguf, self.abin, self.atok] + list(self.vocabs.values()):
            if not os.path.isfile(p):
                sys.exit("corrupt_sweep: missing data file %s (--data)" % p)
        self.dir = os.path.join(work, "base")
        os.makedirs(self.dir, exist_ok=True)
        # a small text: the first stories of the validation text (about 6 KB, whole stories)
        full = open(os.path.join(data, "text", "tinystories_valid.txt"), "rb").read()
        cut = full.find(b"\n\n", 6000)
        self.small_text_bytes = full[: cut + 1 if cut > 0 else 6000]
        self.small = os.path.join(self.dir, "small.txt")
        open(self.small, "wb").write(self.small_text_bytes)
        self.cache = {}
        self.lock = threading.Lock()
        # token ids of the small text (stories260K's tokenizer)
        r = subprocess.run([exe, "tokenize", "-m", self.sbin, "--text-file", self.small],
                           capture_output=True, timeout=120)
        if r.returncode != 0:
            sys.exit("corrupt_sweep: setup tokenize failed: %s" % r.stderr.decode(errors="replace"))
        self.small_ids = [int(x) for x in r.stdout.split()]
        self.small_tokens = os.path.join(self.dir, "small.tokens")
        open(self.small_tokens, "w").write(" ".join(map(str, self.small_ids)) + "\n")
        # a small profile of stories260K.bin on the small text (context 64 + 8, the default selection, so
        # that eval, allocate and analyze run with their defaults at keep ratio 0.5)
        self.sprof = os.path.join(self.dir, "small.profile.json")
        r = subprocess.run([exe, "profile", "--model", self.sbin, "--text", self.small, "--context", "64",
                            "--continuation", "8", "--windows", "2", "-o", self.sprof], capture_output=True,
                           timeout=300)
        if r.returncode != 0:
            sys.exit("corrupt_sweep: setup profile failed: %s" % r.stderr.decode(errors="replace"))
        # the same for stories260K.gguf (eval checks that the profile was measured on the model file)
        self.sprof_gguf = os.path.join(self.dir, "small.gguf.profile.json")
        r = subprocess.run([exe, "profile", "--model", self.sgguf, "--text", self.small, "--context", "64",
                            "--continuation", "8", "--windows", "2", "-o", self.sprof_gguf], capture_output=True,
                           timeout=300)
        if r.returncode != 0:
            sys.exit("corrupt_sweep: setup profile failed: %s" % r.stderr.decode(errors="replace"))
        res = os.path.join(REPO, "docs", "results")
        self.profiles = {  # profile -> (model, is a --preset best profile)
            self.sprof: (self.sbin, False),
            os.path.join(res, "stories260K.profile.json"): (self.sbin, False),
            os.path.join(res, "stories260K.best.profile.json"): (self.sbin, True),
            os.path.join(res, "aidreams260K.profile.json"): (self.abin, False),
            os.path.join(res, "aidreams260K.best.profile.json"): (self.abin, True),
        }
        for p in self.profiles:
            if not os.path.isfile(p):
                sys.exit("corrupt_sweep: missing profile %s" % p)
        # the real models (kinds realgguf, realprofile) and their profiles
        mdir = os.environ.get("DEPTHKV_MODEL_DIR", os.path.expanduser("~/.cache/depthkv/models"))
        self.smol = os.path.join(mdir, "SmolLM2-135M-Instruct.Q4_1.gguf")
        self.gemma = os.path.join(mdir, "gemma-3-270m-q4_k_m.gguf")
        self.real_profiles = {  # profile -> (model, is a --preset best profile)
            os.path.join(res, "smollm2.profile.json"): (self.smol, False),
            os.path.join(res, "smollm2.best.profile.json"): (self.smol, True),
            os.path.join(res, "gemma3.profile.json"): (self.gemma, False),
            os.path.join(res, "gemma3.best.profile.json"): (self.gemma, True),
        }
        self.expected = {}       # expected-output key -> (stdout, {output file: bytes}) of the unmutated input
        self.expected_locks = {}
        self.base_runs = 0
        self.work = work
        self.args = None         # (exe, timeout, mem_mb) of the sweep, set by main

    def need_real(self, kinds):
        for p in ([self.smol, self.gemma] if "realgguf" in kinds or "realprofile" in kinds else []) + (
                list(self.real_profiles) if "realprofile" in kinds else []):
            if not os.path.isfile(p):
                sys.exit("corrupt_sweep: missing %s (DEPTHKV_MODEL_DIR, or the real-model kinds left out with --kind)" % p)

    def header(self, path):
        """The bytes of a GGUF file up to its tensor data (metadata, tensor infos, padding)."""
        key = ("header", path)
        with self.lock:
            have = self.cache.get(key)
        if have is None:
            with open(path, "rb") as f:
                head = f.read(1 << 20)
                need = parse_gguf_size(head)
                while need is None:
                    head += f.read(len(head))
                    need = parse_gguf_size(head)
            have = head[:need]
            with self.lock:
                self.cache[key] = have
        return have

    def real_gguf(self, path):
        key = ("gguf", path)
        with self.lock:
            have = self.cache.get(key)
        if have is None:
            have = parse_gguf(self.header(path))
            have["size"] = os.path.getsize(path)
            with self.lock:
                self.cache[key] = have
        return have

    def read(self, path):
        with self.lock:
            if path not in self.cache:
                self.cache[path] = open(path, "rb").read()
            return self.cache[path]

    def gguf(self, path):
        key = ("gguf", path)
        with self.lock:
            have = self.cache.get(key)
        if have is None:
            have = parse_gguf(self.read(path))
            with self.lock:
                self.cache[key] = have
        return have


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------

def flip_bits(b, rng, n, lo=0, hi=None):
    hi = len(b) if hi is None else hi
    for _ in range(n):
        i = rng.randrange(lo, hi)
        b[i] ^= 1 << rng.randrange(8)


def put(b, off, fmt, v):
    struct.pack_into("<" + fmt, b, off, v)


def pick(rng, weighted):
    """weighted: list of (weight, value)."""
    t = rng.random() * sum(w for w, _ in weighted)
    for w, v in weighted:
        t -= w
        if t <= 0:
            return v
    return weighted[-1][1]


PROMPTS = ["Once upon a time", "Lily found a red ball.", "Hello world, it's 3:14 -- ok?", "a", "The cat"]


# ----------------------------------------------------------------------------------------------
# Kind: profile (JSON profiles)
# ----------------------------------------------------------------------------------------------

REQUIRED_TOP = {"format", "version", "model", "n_layers", "keep_ratios", "metric", "calibration", "scorers"}
REQUIRED_MODEL = {"file", "size", "header_hash", "header_bytes"}
REQUIRED_CAL = {"text_file", "context", "continuation", "skip", "samples", "window_begin", "window_end",
                "description"}
REQUIRED_SCORER = {"n_samples", "kl", "dnll", "top1"}
COUNT_KEYS = {"n_layers", "context", "continuation", "samples", "n_samples", "skip", "window_begin",
              "window_end", "header_bytes", "size", "n_kv_heads", "sinks", "recent", "obs_window", "kernel",
              "lookahead", "eviction_chunk"}


def json_paths(o, path=()):
    """Every (path, value) of a JSON value, containers included."""
    yield path, o
    if isinstance(o, dict):
        for k, v in o.items():
            yield from json_paths(v, path + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from json_paths(v, path + (i,))


def json_get(o, path):
    for p in path:
        o = o[p]
    return o


def json_set(o, path, v):
    json_get(o, path[:-1])[path[-1]] = v


def type_class(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if v is None:
        return "null"
    return type(v).__name__


def required_path(path):
    """Whether the profile reader must find the key at `path` (a key path of strings/ints)."""
    if len(path) == 1:
        return path[0] in REQUIRED_TOP
    if path[0] == "model" and len(path) == 2:
        return path[1] in REQUIRED_MODEL
    if path[0] == "calibration" and len(path) == 2:
        return path[1] in REQUIRED_CAL
    if path[0] == "scorers" and len(path) == 3:
        return path[2] in REQUIRED_SCORER
    if path[0] == "scorers" and len(path) == 4 and path[2] == "heads":
        return path[3] in REQUIRED_SCORER | {"n_kv_heads"}
    if path[0] == "scorers" and len(path) == 4 and path[2] in ("kl", "dnll", "top1"):
        return path[3] in ("mean", "stderr")
    if path[0] == "scorers" and len(path) == 5 and path[2] == "heads" and path[3] in ("kl", "dnll", "top1"):
        return path[4] in ("mean", "stderr")
    if path[0] == "layer_metrics" and len(path) == 3:
        return path[2] == "mean"
    return False


def shaped_array(path):
    """Arrays whose length the reader checks (the curves, keep_ratios, layer metric means)."""
    s = [p for p in path if isinstance(p, str)]
    return (s[-1:] in (["mean"], ["stderr"], ["done"]) or s == ["keep_ratios"]) and not (
        len(s) >= 1 and s[0] == "layer_metrics" and s[-1] != "mean")


def number_rule(path, v):
    """Why the reader must refuse number `v` at `path`, or None."""
    s = [p for p in path if isinstance(p, str)]
    key = s[-1] if s else ""
    if isinstance(v, float) and not math.isfinite(v):
        return "non-finite number"
    if key in COUNT_KEYS and not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
        return "non-integer %s" % key
    if key in COUNT_KEYS and v < 0 and key not in ("skip",):
        return "negative %s" % key
    if key in ("n_layers", "n_kv_heads", "kernel", "obs_window") and v <= 0:  # context 0: "not recorded"
        return "%s <= 0" % key
    if key in COUNT_KEYS and abs(v) >= 2 ** 31 and key not in ("size", "header_bytes"):
        return "%s does not fit an int" % key
    if key == "keep_ratios" or (len(path) >= 2 and path[-2] == "keep_ratios"):
        if not (0 < v <= 1):
            return "keep ratio outside (0, 1]"
    if key == "stderr" and v < 0:
        return "negative stderr"
    if len(s) >= 2 and s[-2] == "kl" and key == "mean" and v < 0:
        return "negative KL"
    if key == "head_alpha" and not (0 <= v <= 1):
        return "head_alpha outside [0, 1]"
    return None


SPECIAL_NUMBERS = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 0, -1, -0.0, 5e-324, 2 ** 31,
                   2 ** 31 - 1, -(2 ** 31), 2 ** 63, 2 ** 64, -(2 ** 63), 1e20, 0.5, 1.5, 3, 100000]


def dump_json(o):
    return json.dumps(o, allow_nan=True).encode()


def reorder_json(o, rng):
    """`o` with every object's keys in a random order (the reader looks keys up: no effect)."""
    if isinstance(o, dict):
        ks = list(o)
        rng.shuffle(ks)
        return {k: reorder_json(o[k], rng) for k in ks}
    if isinstance(o, list):
        return [reorder_json(x, rng) for x in o]
    return o


def last_key(path):
    """The last key name of a JSON path (the name a message about it must hold): a curve's
    mean/stderr by its metric ('kl'), keep_ratios as 'keep ratio'."""
    s = [x for x in path if isinstance(x, str)]
    if s and s[-1] in ("mean", "stderr") and len(s) >= 2:
        return [s[-2]]
    if s and s[-1] == "keep_ratios":
        return ["keep_ratios", "keep ratio"]
    return [s[-1]] if s else []


def gen_profile(base, rng, case, real=False):
    profiles = base.real_profiles if real else base.profiles
    path = rng.choice(sorted(profiles))
    model, best = profiles[path]
    doc = json.loads(base.read(path))
    nodes = list(json_paths(doc))
    leaves = [(p, v) for p, v in nodes if p and not isinstance(v, (dict, list))]
    numbers = [(p, v) for p, v in leaves if type_class(v) == "number"]
    raw = None
    m = pick(rng, [(10, "deep"), (18, "number"), (8, "all-kl"), (12, "type"), (8, "truncate"), (12, "missing"),
                   (8, "count"), (8, "string"), (6, "array"), (6, "whole"), (4, "bitflip"), (5, "whitespace"),
                   (5, "reorder"), (5, "extra-key")])
    if case.control:
        m = "control"
    case.label = ("realprofile/" if real else "profile/") + m
    if m in ("whitespace", "reorder", "extra-key", "control"):
        # neutral: the unmutated file's exact output (the reader ignores layout, key order and keys it
        # does not know: profile_io.hpp looks keys up by name and never lists an object's keys,
        # except scorers and layer_metrics, whose keys are names)
        case.same({"p.json": base.read(path)})
        if m == "whitespace":
            ind = rng.choice([None, 0, 1, 4, "\t"])
            seps = rng.choice([(",", ":"), (", ", ": "), (" ,\n", " :\t"), (",\r\n", ":  ")])
            raw = json.dumps(doc, indent=ind, separators=seps, allow_nan=True).encode()
            raw = rng.choice([b"", b" ", b"\n", b"\r\n\t "]) + raw + rng.choice([b"", b"\n", b"  \n\n"])
        elif m == "reorder":
            raw = dump_json(reorder_json(doc, rng))
        elif m == "extra-key":
            where = rng.choice([(), ("model",), ("calibration",)] + ([("kv_shape",)] if "kv_shape" in doc else []))
            obj = json_get(doc, where)
            obj[rng.choice(["depthkv_sweep", "comment", "x-extra", "general.depthkv_sweep"])] = rng.choice(
                ["x", 1, None, [1, 2], {"a": {"b": []}}, 1e308, True])
            case.label += "/" + ("/".join(where) or "top")
        else:
            raw = base.read(path)
    elif m == "deep":
        depth = rng.choice([64, 1000, 10000, 70000, 200000])
        p, _ = rng.choice(numbers + [((k,), None) for k in ("keep_ratios", "n_layers")])
        json_set(doc, p, "@@DEEP@@")
        raw = dump_json(doc).replace(b'"@@DEEP@@"', b"[" * depth + b"1" + b"]" * depth)
        case.label += "/%d" % depth
        case.refuse("array nested %d deep where %s belongs" % (depth, "/".join(map(str, p))))
    elif m == "number":
        p, old = rng.choice(numbers)
        v = rng.choice(SPECIAL_NUMBERS)
        json_set(doc, p, v)
        case.touched = p
        why = number_rule(p, v)
        if why:
            # a non-finite number makes the JSON invalid: the message can name only that
            case.refuse(why + " at " + "/".join(map(str, p)), names=[] if "non-finite" in why else last_key(p))
        case.label += "/" + "/".join(str(x) for x in p if isinstance(x, str))[-40:]
    elif m == "all-kl":
        v = rng.choice([1e308, 1e300, 1e200, 1.7e308, -1.0, 0.0, 5e-324, 1e-300])
        for p, _ in numbers:
            s = [x for x in p if isinstance(x, str)]
            if len(s) >= 2 and s[-2] == "kl" and s[-1] == "mean":
                json_set(doc, p, v)
        if v < 0:
            case.refuse("negative KL means")
        case.label += "/%g" % v
    elif m == "type":
        p, old = rng.choice([(p, v) for p, v in nodes if p])
        new = rng.choice(["x", "", True, None, {}, [], 0, 1.5, [1, 2], {"a": 1}, "1"])
        json_set(doc, p, new)
        case.touched = p
        same = type_class(old) == type_class(new) or (isinstance(old, list) and isinstance(new, list))
        if not same and (isinstance(p[-1], int) or required_path(p) or p[0] in ("scorers", "layer_metrics")
                         or (p[0] == "calibration" and len(p) >= 2)):
            case.refuse("%s replaced by a %s" % ("/".join(map(str, p)), type_class(new)), names=last_key(p))
        case.label += "/" + type_class(old) + "->" + type_class(new)
    elif m == "truncate":
        full = dump_json(doc) if rng.random() < 0.5 else base.read(path)
        body = full.rstrip()
        raw = full[: rng.randrange(0, len(body))]
        case.refuse("truncated JSON")
    elif m == "missing":
        dicts = [(p, v) for p, v in nodes if isinstance(v, dict) and v]
        p, d = rng.choice(dicts)
        k = rng.choice(sorted(d))
        del d[k]
        case.touched = p + (k,)
        if required_path(p + (k,)):
            case.refuse("missing required key " + "/".join(map(str, p + (k,))), names=[str(k)])
        case.label += "/" + str(k)
    elif m == "count":
        key = rng.choice(["n_layers", "context", "continuation", "samples", "n_samples", "n_kv_heads", "window_end",
                          "sinks", "recent", "obs_window", "kernel", "lookahead"])
        v = rng.choice([0, -1, -5, 2 ** 31, 2 ** 31 - 1, 2 ** 32 + 1, 10 ** 9, 100000, 1, 2 ** 53])
        hits = [p for p, _ in numbers if p[-1] == key]
        if not hits:
            p = ("calibration", key) if key in REQUIRED_CAL else ("n_layers",)
            v = v if p == ("calibration", key) else v
        for p in hits or [p]:
            json_set(doc, p, v)
            why = number_rule(p, v)
            if why:
                case.refuse(why, names=last_key(p))
        case.label += "/%s=%d" % (key, v)
    elif m == "string":
        strs = [(p, v) for p, v in leaves if isinstance(v, str)]
        p, old = rng.choice(strs)
        case.touched = p
        kind = rng.choice(["bogus", "empty", "huge", "utf8", "nul"])
        if kind == "bogus":
            json_set(doc, p, old + "x")
            if p[-1] in ("format", "metric", "pooling", "head_alloc", "rule"):
                case.refuse("unknown %s" % p[-1])
        elif kind == "empty":
            json_set(doc, p, "")
            if p[-1] in ("format", "pooling", "head_alloc", "rule"):
                case.refuse("empty %s" % p[-1])
        elif kind == "huge":
            json_set(doc, p, "A" * rng.choice([10 ** 5, 10 ** 6]))
            if p[-1] in ("format", "metric", "pooling", "head_alloc", "rule"):
                case.refuse("unknown %s" % p[-1])
        elif kind == "utf8":
            json_set(doc, p, "@@BAD@@")
            raw = dump_json(doc).replace(b"@@BAD@@", rng.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf"]))
            case.refuse("invalid UTF-8 in a JSON string")
        else:
            json_set(doc, p, old + "\u0000z")
            if p[-1] in ("format", "pooling", "head_alloc", "rule"):
                case.refuse("NUL in %s" % p[-1])
        case.label += "/" + kind
    elif m == "array":
        arrs = [(p, v) for p, v in nodes if isinstance(v, list) and v]
        p, arr = rng.choice(arrs)
        op = rng.choice(["drop", "dup", "huge", "reverse"])
        if op == "drop":
            arr.pop(rng.randrange(len(arr)))
        elif op == "dup":
            arr.append(arr[-1])
        elif op == "huge":
            arr.extend([arr[-1]] * rng.choice([1000, 100000]))
        else:
            arr.reverse()
        if op != "reverse" and shaped_array(p):
            case.refuse("array %s of the wrong length" % "/".join(map(str, p)))
        if op == "reverse" and p == ("keep_ratios",) and len(arr) > 1:
            case.refuse("unsorted keep ratios")
        case.label += "/" + op
    elif m == "whole":
        raw = rng.choice([b"", b"null", b"[]", b"{}", b"0", b'"depthkv-profile"', b"\xef\xbb\xbf" + dump_json(doc),
                          dump_json(doc) + b"\n{}", dump_json(doc) + b"garbage", b"\x00" * 64,
                          dump_json(doc).replace(b"{", b"{\"format\": \"x\", ", 1)])
        if not raw.startswith(b"\xef\xbb\xbf") and not raw.startswith(b'{"format": "x", '):  # duplicate key: last wins
            case.refuse("not a profile")
        case.label += "/%d" % len(raw)
    elif m == "control":
        pass
    else:  # bit flips in the text
        b = bytearray(dump_json(doc))
        flip_bits(b, rng, rng.randint(1, 4))
        raw = bytes(b)
    case.files["p.json"] = raw if raw is not None else dump_json(doc)
    P = "{D}/p.json"
    text = ["--text", base.small]
    if real:
        gen_real_profile_command(base, rng, case, P, model, best, m)
        return
    c = pick(rng, [(55, "allocate"), (20, "eval"), (13, "analyze"), (12, "generate")])
    if m == "all-kl":
        c = "allocate"  # prints the predicted loss
    if c == "allocate":
        case.argv = ["allocate", "--profile", P, "--keep", rng.choice(["0.5", "0.75", "1"])]
        if best:
            case.argv += ["--preset", "best"]
        else:
            case.argv += ["--policy", "optimal" if m == "all-kl" else
                          rng.choice(["optimal", "proportional", "uniform", "pyramid", "middle"])]
        if rng.random() < 0.5:
            case.argv += ["--json"]
    elif c == "eval":
        case.argv = ["eval", "--model", model, "--profile", P] + text + ["--windows", "1", "--keeps", "0.5"]
        if path != base.sprof:
            case.argv += ["--context", "64", "--continuation", "8", "--skip", "0"]
        if best:
            case.argv += ["--preset", "best", "--lookahead", "4"]
        else:
            case.argv += ["--policies", "uniform,optimal"]
        if rng.random() < 0.3:
            case.argv += ["--json"]
        if m == "string" and p[0] == "model" and p[-1] != "file":
            case.refuse("model identity changed")
        if m in ("number", "count") and p[0] == "model":
            case.refuse("model identity changed")
    elif c == "analyze":
        case.argv = ["analyze", "--model", model, "--profile", P] + text + ["--samples", "4", "--max-tokens", "32",
                                                                            "--batch", "4", "--skip", "0"]
        if rng.random() < 0.3:
            case.argv += ["--json"]
    else:
        case.argv = ["generate", "--model", model, "--profile", P, "--keep", "0.5", "-t", "0", "--steps", "24",
                     "--prompt", "Once upon a time"]
        case.argv += ["--preset", "best", "--lookahead", "4"] if best else ["--policy", "optimal"]


LONG_PROMPT = ("Once upon a time, a little girl named Lily found a red ball in the park. She played with it all "
               "day and then she")


def gen_real_profile_command(base, rng, case, P, model, best, m):
    """allocate (the real profiles' own use, fast) or, for SmolLM2, a short pruned generation."""
    c = pick(rng, [(88, "allocate"), (12 if model == base.smol else 0, "generate")])
    if c == "allocate":
        case.argv = ["allocate", "--profile", P, "--keep", rng.choice(["0.2", "0.5", "0.75", "1"])]
        if best:
            case.argv += ["--preset", "best", "--lookahead", "0"] if rng.random() < 0.7 else ["--policy", "head-optimal",
                                                                                             "--scorer", "snapkv"]
        else:
            case.argv += ["--policy", rng.choice(["optimal", "proportional", "uniform", "pyramid", "middle"])]
        if rng.random() < 0.5:
            case.argv += ["--json"]
        if rng.random() < 0.2:
            case.argv += ["--length", rng.choice(["64", "100", "384", "1000"])]
    else:
        case.argv = ["generate", "-m", model, "--profile", P, "--keep", "0.5", "-t", "0", "-n", "40", "--threads", "1",
                     "-i", LONG_PROMPT]
        case.argv += ["--preset", "best", "--lookahead", "0"] if best else ["--policy", "optimal", "--scorer", "snapkv"]
        case.timeout_scale = 3.0
        t = getattr(case, "touched", None)
        if t and t[0] == "model" and len(t) >= 2 and t[1] != "file" and m in ("number", "string", "missing", "type"):
            case.refuse("model identity changed (generate checks the profile against the model)")


# ----------------------------------------------------------------------------------------------
# GGUF files
# ----------------------------------------------------------------------------------------------

GT_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GT_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
# bytes per block and elements per block of the ggml types the sizes below use
GGML_BLOCK = {0: (4, 1), 1: (2, 1), 30: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32)}


def parse_gguf(b):
    """Offsets of the header fields, key/values and tensor infos of a GGUF v3 file."""
    g = {"kvs": [], "tensors": []}
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    o = 24

    def rstr(o):
        n = struct.unpack_from("<Q", b, o)[0]
        return b[o + 8:o + 8 + n], o + 8 + n

    for _ in range(n_kv):
        kv = {"off": o}
        key, o = rstr(o)
        kv["key"] = key.decode(errors="replace")
        kv["type_off"] = o
        t = struct.unpack_from("<I", b, o)[0]
        o += 4
        kv["type"] = t
        kv["value_off"] = o
        if t == 8:
            kv["value"], o = rstr(o)
        elif t == 9:
            et, cnt = struct.unpack_from("<IQ", b, o)
            kv["elem_type"], kv["count"] = et, cnt
            o += 12
            kv["elems_off"] = o
            if et == 8:
                offs = []
                for _ in range(cnt):
                    offs.append(o)
                    o += 8 + struct.unpack_from("<Q", b, o)[0]
                kv["elem_offs"] = offs
            else:
                o += GT_SIZE[et] * cnt
        else:
            kv["value"] = struct.unpack_from("<" + GT_FMT[t], b, o)[0]
            o += GT_SIZE[t]
        kv["end"] = o
        g["kvs"].append(kv)
    for _ in range(n_tensors):
        t = {"off": o}
        name, o = rstr(o)
        t["name"] = name.decode(errors="replace")
        t["ndims_off"] = o
        nd = struct.unpack_from("<I", b, o)[0]
        o += 4
        t["dims_off"] = o
        t["dims"] = list(struct.unpack_from("<%dQ" % nd, b, o))
        o += 8 * nd
        t["type_off"] = o
        t["type"], t["offset"] = struct.unpack_from("<IQ", b, o)
        t["offset_off"] = o + 4
        o += 12
        g["tensors"].append(t)
    g["meta_end"] = o
    align = 32
    for kv in g["kvs"]:
        if kv["key"] == "general.alignment":
            align = kv["value"]
    g["align"] = align
    g["data"] = (o + align - 1) // align * align
    return g


def parse_gguf_size(b):
    """The tensor data offset of GGUF header bytes `b`, or None when `b` holds less than the header."""
    try:
        g = parse_gguf(b)
    except (struct.error, IndexError, KeyError):
        return None
    return g["data"] if g["data"] <= len(b) else None


def gguf_kv(g, key):
    for kv in g["kvs"]:
        if kv["key"] == key:
            return kv
    return None


def tensor_elems(t):
    n = 1
    for d in t["dims"]:
        n *= d
    return n


def gen_gguf(base, rng, case):
    vocab_only = rng.random() < 0.4
    if vocab_only:
        v = pick(rng, [(30, "llama-spm"), (25, "phi-3"), (30, "gpt-2"), (7.5, "llama-bpe"), (7.5, "qwen2")])
        src = base.vocabs[v]
        if v in ("llama-bpe", "qwen2"):
            case.timeout_scale = 3.0
    else:
        src = base.sgguf
    orig = base.read(src)
    g = base.gguf(src)
    b = bytearray(orig)
    m = pick(rng, [(14, "bitflip"), (10, "truncate"), (8, "counts"), (4, "version"), (3, "magic"), (26, "kv"),
                   (0 if vocab_only else 18, "tensor"), (0 if vocab_only else 10, "weights"), (4, "append")])
    if case.control:
        m = "control"
    case.label = "gguf/" + m
    n_vocab = gguf_kv(g, "tokenizer.ggml.tokens")["count"]
    case.n_vocab = n_vocab
    if m == "control":
        case.same({"f.gguf": orig})
    elif m == "bitflip":
        if rng.random() < 0.6:
            flip_bits(b, rng, rng.randint(1, 8), 0, g["meta_end"])
            case.label += "/meta"
        else:
            flip_bits(b, rng, rng.randint(1, 8))
    elif m == "truncate":
        end = g["meta_end"] if vocab_only else len(b)
        cut = rng.randrange(0, end) if rng.random() < 0.7 else rng.randrange(0, min(end, 4096))
        b = b[:cut]
        case.refuse("truncated GGUF (%d of %d bytes)" % (cut, len(orig)))
    elif m == "counts":
        which = rng.choice(["n_tensors", "n_kv"])
        off = 8 if which == "n_tensors" else 16
        old = struct.unpack_from("<Q", b, off)[0]
        new = rng.choice([old + 1, old + 1000, max(old - 1, 0), 0, 2 ** 63, 2 ** 64 - 1, 2 ** 32, 2 ** 31])
        put(b, off, "Q", new)
        if new > old or (which == "n_tensors" and new < old) or (which == "n_kv" and new < old and not vocab_only):
            case.refuse("%s changed %d -> %d" % (which, old, new))
        case.label += "/%s" % which
    elif m == "version":
        v = rng.choice([0, 1, 2, 4, 5, 2 ** 31, 2 ** 32 - 1])
        put(b, 4, "I", v)
        if v not in (2, 3):
            case.refuse("GGUF version %d" % v)
        case.label += "/%d" % v
    elif m == "magic":
        b[rng.randrange(4)] ^= 0x20
        case.refuse("not GGUF magic (read as a llama2.c checkpoint)")
    elif m == "kv":
        kv = rng.choice(g["kvs"])
        key = kv["key"]
        sub = rng.choice(["value", "type", "keylen", "special"] if kv["type"] != 9 else
                         ["count", "elemtype", "elem", "type", "special"])
        case.label += "/" + sub
        if sub == "special":
            special = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.token_type",
                       "tokenizer.ggml.model", "tokenizer.ggml.scores", "general.alignment"]
            if not vocab_only:
                special += ["llama.embedding_length", "llama.block_count", "llama.attention.head_count",
                            "llama.attention.head_count_kv", "llama.feed_forward_length", "llama.context_length",
                            "llama.attention.layer_norm_rms_epsilon", "general.architecture", "llama.rope.freq_base"]
            special = [s for s in special if gguf_kv(g, s)]
            kv = gguf_kv(g, rng.choice(special))
            key = kv["key"]
            case.label += "/" + key
            if key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
                v = rng.choice([2 ** 32 - 1, n_vocab, n_vocab + 1, 2 ** 31, 2 ** 31 - 1])
                put(b, kv["value_off"], GT_FMT[kv["type"]], v & ((1 << (8 * GT_SIZE[kv["type"]])) - 1))
                if v != 2 ** 32 - 1 or kv["type"] not in (4, 10):  # uint32 0xFFFFFFFF: llama.cpp's "no token"
                    case.refuse("%s = %d outside the vocabulary of %d" % (key, v if v < 2 ** 31 else v - 2 ** 32, n_vocab),
                                names=[key.split(".")[-1]])
            elif key == "tokenizer.ggml.token_type":
                n = rng.choice([1, 5, 100])
                for _ in range(n):
                    i = rng.randrange(kv["count"])
                    put(b, kv["elems_off"] + 4 * i, "i", rng.choice([7, 8, 99, -1, -7, 2 ** 31 - 1]))
                case.refuse("token types outside the enum")
            elif key == "tokenizer.ggml.model":
                new = rng.choice([b"bert", b"xxxx", b"", b"gpt2", b"llama", b"t5"])
                b = b[:kv["value_off"]] + struct.pack("<Q", len(new)) + new + b[kv["end"]:]
                if new not in (b"gpt2", b"llama"):
                    case.refuse("tokenizer model '%s'" % new.decode())
            elif key == "tokenizer.ggml.scores":
                for _ in range(rng.choice([1, 10, 1000])):
                    i = rng.randrange(kv["count"])
                    put(b, kv["elems_off"] + 4 * i, "f", rng.choice([float("nan"), float("inf"), -float("inf"), 3e38]))
            elif key == "general.alignment":
                v = rng.choice([0, 1, 3, 7, 64, 2 ** 31, 2 ** 32 - 1])
                put(b, kv["value_off"], "I", v)
                if v in (0, 3, 7, 2 ** 31, 2 ** 32 - 1) or (v != 32 and not vocab_only):
                    case.refuse("alignment %d" % v)
            elif key == "general.architecture":
                new = rng.choice([b"gpt2", b"xxxx", b"", b"llamA"])
                b = b[:kv["value_off"]] + struct.pack("<Q", len(new)) + new + b[kv["end"]:]
                case.refuse("architecture '%s'" % new.decode())
            elif kv["type"] in (6, 12):
                v = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38])
                put(b, kv["value_off"], GT_FMT[kv["type"]], v)
                if not math.isfinite(v) or (v <= 0 and "epsilon" not in key):
                    case.refuse("%s = %g" % (key, v))
                if "epsilon" in key and (v < 0 or not math.isfinite(v)):
                    case.refuse("%s = %g" % (key, v))
            else:  # integer hyperparameters
                old = kv["value"]
                v = rng.choice([0, 2 ** 32 - 1, 2 ** 31, old + 1, old * 2, 1, 10 ** 6])
                put(b, kv["value_off"], GT_FMT[kv["type"]], v & ((1 << (8 * GT_SIZE[kv["type"]])) - 1))
                if key.endswith("context_length"):
                    if v == 0 or v >= 2 ** 31:
                        case.refuse("%s = %d" % (key, v))
                elif v != old and not (key.endswith("block_count") and 0 < v < old):
                    case.refuse("%s %d -> %d (the tensors disagree)" % (key, old, v))
        elif sub == "value":
            if kv["type"] == 8:
                n = struct.unpack_from("<Q", b, kv["value_off"])[0]
                new = rng.choice([n + 1, n + 10 ** 6, 2 ** 63, 2 ** 64 - 1, 2 ** 40])
                put(b, kv["value_off"], "Q", new)
                case.refuse("string length %d -> %d" % (n, new))
            else:
                t = kv["type"]
                bits = 8 * GT_SIZE[t]
                v = rng.choice([0, (1 << bits) - 1, 1 << (bits - 1), rng.getrandbits(bits)])
                b[kv["value_off"]:kv["value_off"] + GT_SIZE[t]] = v.to_bytes(GT_SIZE[t], "little")
        elif sub == "type":
            t = rng.choice([13, 99, 2 ** 31, 2 ** 32 - 1] + list(GT_SIZE) + [8, 9])
            if t != kv["type"]:
                put(b, kv["type_off"], "I", t)
                if t > 12:
                    case.refuse("key/value type %d" % t)
        elif sub == "keylen":
            n = struct.unpack_from("<Q", b, kv["off"])[0]
            put(b, kv["off"], "Q", rng.choice([0, n + 1, n + 10 ** 7, 2 ** 63, 2 ** 64 - 1]))
            case.refuse("key length changed")
        elif sub == "count":
            c = kv["count"]
            new = rng.choice([c + 1, c + 1000, 2 ** 62, 2 ** 64 - 1, 2 ** 40, max(c - 1, 0), 0])
            put(b, kv["value_off"] + 4, "Q", new)
            if new > c:
                case.refuse("array count %d -> %d" % (c, new))
            case.label += "/" + key.split(".")[-1]
        elif sub == "elemtype":
            t = rng.choice([13, 99, 2 ** 32 - 1, 9] + list(GT_SIZE) + [8])
            if t != kv["elem_type"]:
                put(b, kv["value_off"], "I", t)
                if t > 12 or t == 9:
                    case.refuse("array element type %d" % t)
        else:  # one element
            i = rng.randrange(kv["count"]) if kv["count"] else 0
            if kv["count"] and kv["elem_type"] == 8:
                eo = kv["elem_offs"][i]
                n = struct.unpack_from("<Q", b, eo)[0]
                new = rng.choice([n + 1, 2 ** 63, 2 ** 40, 0, n + 100000])
                put(b, eo, "Q", new)
                if new != 0:
                    case.refuse("array string length %d -> %d" % (n, new))
            elif kv["count"]:
                es = GT_SIZE[kv["elem_type"]]
                eo = kv["elems_off"] + es * i
                b[eo:eo + es] = bytes(rng.getrandbits(8) for _ in range(es))
            case.label += "/" + key.split(".")[-1]
    elif m == "tensor":
        t = rng.choice(g["tensors"])
        sub = rng.choice(["ndims", "dim", "type", "offset", "name", "namelen"])
        case.label += "/" + sub
        if sub == "ndims":
            v = rng.choice([0, 3, 4, 5, 255, 2 ** 32 - 1])
            put(b, t["ndims_off"], "I", v)
            if v != len(t["dims"]):
                case.refuse("tensor %s n_dims %d -> %d" % (t["name"], len(t["dims"]), v))
        elif sub == "dim":
            i = rng.randrange(len(t["dims"]))
            v = rng.choice([0, t["dims"][i] + 1, t["dims"][i] * 2, 2 ** 32, 2 ** 63, 2 ** 64 - 1, 1])
            put(b, t["dims_off"] + 8 * i, "Q", v)
            if v != t["dims"][i]:
                case.refuse("tensor %s dim %d -> %d" % (t["name"], t["dims"][i], v), names=[t["name"]])
        elif sub == "type":
            v = rng.choice([1, 2, 3, 8, 12, 14, 30, 39, 99, 2 ** 32 - 1])
            put(b, t["type_off"], "I", v)
            if v >= 64:
                case.refuse("tensor type %d" % v)
            elif v in GGML_BLOCK and t["dims"][0] % GGML_BLOCK[v][1] != 0:
                case.refuse("tensor type %d with row length %d" % (v, t["dims"][0]))
        elif sub == "offset":
            v = rng.choice([t["offset"] + 1, t["offset"] + 4, len(b), 2 ** 40, 2 ** 64 - 1, 2 ** 63, len(b) - g["data"]])
            put(b, t["offset_off"], "Q", v)
            size = tensor_elems(t) * 4 if t["type"] == 0 else 0
            if v % g["align"] or g["data"] + v + size > len(b):
                case.refuse("tensor %s offset %d (misaligned or past the end)" % (t["name"], v))
        elif sub == "name":
            i = t["off"] + 8 + rng.randrange(len(t["name"]))
            b[i] = ord("X") if b[i] != ord("X") else ord("Y")
            case.refuse("tensor name changed: a tensor is missing")
        else:
            put(b, t["off"], "Q", rng.choice([0, 2 ** 63, 2 ** 40, len(t["name"]) + 1000]))
            case.refuse("tensor name length changed")
    elif m == "weights":
        t = rng.choice([x for x in g["tensors"] if x["type"] == 0])
        v = rng.choice([float("nan"), float("inf"), 3e38, -3e38, 1e30])
        n = tensor_elems(t)
        o = g["data"] + t["offset"]
        whole = rng.random() < 0.5
        idx = range(n) if whole else [rng.randrange(n)]
        pv = struct.pack("<f", v)
        for i in idx:
            b[o + 4 * i:o + 4 * i + 4] = pv
        case.label += "/%s/%s" % ("whole" if whole else "one", "%g" % v)
        if not math.isfinite(v) and (whole or t["name"] not in ("token_embd.weight",)):
            case.refuse("non-finite weight in %s" % t["name"])
    else:  # append
        b += bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 7, 1000])))
    case.files["f.gguf"] = bytes(b)
    F = "{D}/f.gguf"
    if vocab_only:
        c = pick(rng, [(85, "tokenize"), (15, "generate")])
        if case.control:
            c = "tokenize"  # a vocabulary-only file has no weights to generate with
    else:
        c = pick(rng, [(35, "generate"), (30, "perplexity"), (15, "tokenize"), (10, "profile"), (10, "eval")])
        if c == "tokenize" and case.must_refuse and (
                m in ("tensor", "weights", "append") or (m == "counts" and "n_tensors" in case.label) or
                (m == "kv" and "/special/" in case.label and "/tokenizer." not in case.label) or
                (m == "truncate" and len(b) >= g["meta_end"])):
            case.must_refuse = None  # tokenize reads the vocabulary only
    gen_model_command(base, rng, case, c, F, vocab_only=vocab_only, gguf=not vocab_only,
                      bpe=vocab_only and any(src == base.vocabs[v] for v in BPE_VOCABS))


BPE_VOCABS = ("gpt-2", "llama-bpe", "qwen2")


# ----------------------------------------------------------------------------------------------
# Kind: realgguf (SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M: the real model files)
# ----------------------------------------------------------------------------------------------

# ggml type -> (bytes per block, the byte ranges of a block that hold quants, not f16 scales)
QUANT_PAYLOAD = {2: (18, (2, 18)), 3: (20, (4, 20)), 6: (22, (6, 22)), 8: (34, (2, 34)), 12: (144, (16, 144)),
                 14: (210, (0, 192))}


def kv_blob(key, t, value):
    """One GGUF key/value: t 8 string (bytes), 4 uint32, 6 float32, (9, elem type, [values]) an array."""
    k = key.encode()
    out = struct.pack("<Q", len(k)) + k
    if t == 8:
        return out + struct.pack("<IQ", 8, len(value)) + value
    if t == 9:
        et, vals = value
        return out + struct.pack("<IIQ", 9, et, len(vals)) + b"".join(struct.pack("<" + GT_FMT[et], v) for v in vals)
    return out + struct.pack("<I", t) + struct.pack("<" + GT_FMT[t], value)


def relayout(src, head, g, blobs, align=None, pad_fill=0, tinfo=None):
    """A GGUF file of metadata `blobs` (bytes each), the tensor infos (`tinfo`, default the original's),
    padded to `align` (default the file's) with byte `pad_fill`, then the original tensor data."""
    tinfo = head[g["kvs"][-1]["end"]:g["meta_end"]] if tinfo is None else tinfo
    meta = bytearray(head[:24]) + b"".join(blobs) + tinfo
    put(meta, 16, "Q", len(blobs))
    a = align or g["align"]
    data = (len(meta) + a - 1) // a * a
    meta += bytes([pad_fill]) * (data - len(meta))
    return Spliced([bytes(meta), (src, g["data"], g["size"] - g["data"])])


def gen_realgguf(base, rng, case):
    gemma = rng.random() < 0.4
    src = base.gemma if gemma else base.smol
    arch = "gemma3" if gemma else "llama"
    head = base.header(src)
    g = base.real_gguf(src)
    size = g["size"]
    whole = Spliced([(src, 0, size)])
    blobs = [head[kv["off"]:kv["end"]] for kv in g["kvs"]]
    case.n_vocab = gguf_kv(g, "tokenizer.ggml.tokens")["count"]
    L = gguf_kv(g, arch + ".block_count")["value"]
    m = pick(rng, [(6, "extra-key"), (5, "reorder"), (4, "padding"), (4, "alignment"), (16 if gemma else 0, "swa"),
                   (16, "hparam"), (8, "tokenizer"), (12, "tensor-info"), (12, "tensor-data"), (10, "truncate"),
                   (4, "kv-bytes")])
    if case.control:
        m = "control"
    case.label = "realgguf/%s/%s" % ("gemma3" if gemma else "smollm2", m)
    hp = False  # a hyper-parameter / tensor mutation (tokenize reads the vocabulary only)
    f = None
    if m == "control":
        f = whole
        case.same({"f.gguf": whole})
    elif m == "extra-key":
        blobs.insert(rng.randrange(len(blobs) + 1), kv_blob(rng.choice(["general.depthkv_sweep", "depthkv.sweep.note"]),
                                                          8, b"x" * rng.choice([0, 1, 7, 31, 1000])))
        f = relayout(src, head, g, blobs)
        case.same({"f.gguf": whole})
    elif m == "reorder":
        rng.shuffle(blobs)
        f = relayout(src, head, g, blobs)
        case.same({"f.gguf": whole})
    elif m == "padding":
        if g["data"] == g["meta_end"]:  # no padding: add a key of a length that leaves some
            blobs.append(kv_blob("general.depthkv_sweep", 8, b"pad"))
            case.label += "/added"
        f = relayout(src, head, g, blobs, pad_fill=rng.choice([0x01, 0xff, 0x55]))
        case.same({"f.gguf": whole})
    elif m == "alignment":
        v = rng.choice([32, 64, 64, 256, 0, 3, 7, 48])
        blobs.append(kv_blob("general.alignment", 4, v))
        if v in (32, 64, 256) and all(t["offset"] % v == 0 for t in g["tensors"]):
            f = relayout(src, head, g, blobs, align=v)  # data at the new alignment: same tensors
            case.same({"f.gguf": whole})
        else:
            f = relayout(src, head, g, blobs, align=32 if v == 0 else v if v % 8 == 0 else 8)
            case.refuse("alignment %d" % v, names=["alignment"])
        case.label += "/%d" % v
    elif m == "swa":
        sub = rng.choice(["pattern", "pattern", "window", "window", "drop-window", "base"])
        case.label += "/" + sub
        hp = True
        pk, wk, bk = arch + ".attention.sliding_window_pattern", arch + ".attention.sliding_window", arch + ".rope.freq_base_swa"
        if sub == "pattern":
            form = rng.choice(["default", "default", "all-local", "all-global", "random", "short", "long", "int32",
                               "uint8", "string"])
            default = [1 if (l + 1) % 6 else 0 for l in range(L)]
            vals = {"default": default, "all-local": [1] * L, "all-global": [0] * L,
                    "random": [rng.randrange(2) for _ in range(L)], "short": default[:-1],
                    "long": default + [1], "int32": default, "uint8": default, "string": default}[form]
            if form == "string":
                blob = kv_blob(pk, 8, b"".join(b"1" if x else b"0" for x in vals))
            else:
                blob = kv_blob(pk, 9, ({"int32": 5, "uint8": 0}.get(form, 7), vals))
            blobs.insert(rng.randrange(len(blobs) + 1), blob)
            case.label += "/" + form
            if form == "default":
                case.same({"f.gguf": whole})
            elif form in ("short", "long", "int32", "uint8", "string"):
                case.refuse("%s %s" % (pk, form), names=["sliding_window_pattern"])
        elif sub == "window":
            kv = gguf_kv(g, wk)
            v = rng.choice([0, 2 ** 24 + 1, 2 ** 31, 1, 2, 3, 64, 1024, 32768])
            i = g["kvs"].index(kv)
            blobs[i] = kv_blob(wk, 4, v)
            case.label += "/%d" % v
            if v == 0 or v > 2 ** 24:
                case.refuse("%s = %d" % (wk, v), names=["sliding_window"])
            elif v >= 64:
                case.same({"f.gguf": whole})  # wider than the runs' 8 positions: no attention changes
        elif sub == "drop-window":
            i = g["kvs"].index(gguf_kv(g, wk))
            del blobs[i]
            case.refuse("%s missing" % wk, names=["sliding_window"])
        else:
            v = rng.choice([10000.0, 10000.0, float("nan"), float("inf"), 0.0, 1.0, -5.0, 1e13, 1e6])
            blobs.insert(rng.randrange(len(blobs) + 1), kv_blob(bk, 6, v))
            case.label += "/%g" % v
            if v == 10000.0:
                case.same({"f.gguf": whole})  # Gemma 3's local RoPE base, the default without the key
            elif not (math.isfinite(v) and 1.0 < v < 1e12):
                case.refuse("%s = %g" % (bk, v), names=["freq_base_swa"])
        f = relayout(src, head, g, blobs)
    elif m in ("hparam", "tokenizer", "kv-bytes"):
        if m == "hparam":
            hp = True
            names = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                     "attention.head_count_kv", "context_length", "rope.freq_base",
                     "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
                     "rope.dimension_count"]
            kv = None
            while kv is None:
                kv = gguf_kv(g, arch + "." + rng.choice(names))
        elif m == "tokenizer":
            kv = gguf_kv(g, rng.choice(["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.model", "general.architecture", "tokenizer.ggml.add_bos_token"]))
        else:
            kv = rng.choice(g["kvs"])
        key = kv["key"]
        i = g["kvs"].index(kv)
        b = bytearray(blobs[i])
        vo = kv["value_off"] - kv["off"]
        case.label += "/" + key.split(".", 1)[-1]
        if m == "kv-bytes":  # the value's bytes of a key no reader needs, or any key's type / length field
            sub = rng.choice(["type", "keylen", "strlen"] if kv["type"] == 8 else ["type", "keylen"])
            if sub == "type":
                put(b, kv["type_off"] - kv["off"], "I", rng.choice([13, 99, 2 ** 32 - 1]))
                case.refuse("key/value type of %s" % key)
            elif sub == "keylen":
                put(b, 0, "Q", rng.choice([0, 2 ** 63, 2 ** 40, len(key) + 10 ** 9]))
                case.refuse("key length of %s" % key)
            else:
                put(b, vo, "Q", rng.choice([2 ** 63, 2 ** 40, 2 ** 64 - 1]))
                case.refuse("string length of %s" % key)
            case.label += "/" + sub
        elif kv["type"] == 8:
            new = {"tokenizer.ggml.model": [b"bert", b"", b"t5", b"gpt2" if gemma else b"llama"],
                   "general.architecture": [b"gpt2", b"", b"llamA", b"gemma2", b"qwen2" if not gemma else b"llama"]}[key]
            v = rng.choice(new)
            b = b[:vo] + struct.pack("<Q", len(v)) + v
            case.refuse("%s '%s'" % (key, v.decode()), names=[] if v in (b"", b"qwen2", b"llama", b"gpt2") else
                        [v.decode(), "tokenizer"])
            if key == "general.architecture":
                hp = True
        elif kv["type"] == 7:
            b[vo] ^= 1
            case.label += "/flip"
        elif kv["type"] in (6, 12):
            v = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38, 1e-30, kv["value"] * 2])
            put(b, vo, GT_FMT[kv["type"]], v)
            eps = "epsilon" in key
            if not math.isfinite(v) or v <= 0 or (eps and v >= 1) or (not eps and (v <= 1 or v >= 1e12)):
                case.refuse("%s = %g" % (key, v), names=[key.split(".", 1)[1]])
            case.label += "/%g" % v
        else:
            old = kv["value"]
            if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
                v = rng.choice([case.n_vocab, case.n_vocab + 1, 2 ** 31, 2 ** 31 - 1, 2 ** 32 - 1])
                if v != 2 ** 32 - 1:
                    case.refuse("%s = %d outside the vocabulary of %d" % (key, v, case.n_vocab),
                                names=[key.split(".")[-1]])
            else:
                v = rng.choice([0, 2 ** 32 - 1, 2 ** 31, old + 1, old * 2, 1, 10 ** 6, old - 1, 9])
                if key.endswith("context_length"):
                    if v == 0 or v > 2 ** 24:
                        case.refuse("%s = %d" % (key, v), names=["context_length"])
                elif v != old and not (key.endswith("block_count") and 0 < v < old):
                    case.refuse("%s %d -> %d (the tensors disagree)" % (key, old, v))
            put(b, vo, GT_FMT[kv["type"]], v & ((1 << (8 * GT_SIZE[kv["type"]])) - 1))
            case.label += "/" + ("same" if v == old else "changed")
            if v == old:
                case.same({"f.gguf": whole})
        blobs[i] = bytes(b)
        if m == "kv-bytes":
            f = Spliced([head[:kv["off"]] + bytes(b) + head[kv["end"]:], (src, g["data"], size - g["data"])])
        else:
            f = relayout(src, head, g, blobs)
    elif m == "tensor-info":
        hp = True
        t = rng.choice(g["tensors"])
        sub = rng.choice(["ndims", "dim", "type", "offset", "name"])
        case.label += "/" + sub
        h = bytearray(head)
        if sub == "ndims":
            v = rng.choice([0, 3, 4, 5, 255, 2 ** 32 - 1])
            put(h, t["ndims_off"], "I", v)
            case.refuse("tensor %s n_dims %d -> %d" % (t["name"], len(t["dims"]), v))
        elif sub == "dim":
            i = rng.randrange(len(t["dims"]))
            v = rng.choice([0, t["dims"][i] + 1, t["dims"][i] * 2, 2 ** 32, 2 ** 63, 2 ** 64 - 1])
            put(h, t["dims_off"] + 8 * i, "Q", v)
            case.refuse("tensor %s dim %d -> %d" % (t["name"], t["dims"][i], v), names=[t["name"]])
        elif sub == "type":
            v = rng.choice([99, 2 ** 32 - 1, 64, 1000])  # no ggml type (39 is MXFP4: of another size, not refused)
            put(h, t["type_off"], "I", v)
            case.refuse("tensor %s type %d" % (t["name"], v), names=[t["name"]])
        elif sub == "offset":
            v = rng.choice([t["offset"] + 1, t["offset"] + 4, size, 2 ** 40, 2 ** 64 - 1, 2 ** 63])
            put(h, t["offset_off"], "Q", v)
            case.refuse("tensor %s offset %d (misaligned or past the end)" % (t["name"], v), names=[t["name"]])
        else:
            i = t["off"] + 8 + rng.randrange(len(t["name"]))
            h[i] = ord("X") if h[i] != ord("X") else ord("Y")
            case.refuse("tensor name changed: %s is missing" % t["name"])
        f = Spliced([bytes(h), (src, g["data"], size - g["data"])])
    elif m == "tensor-data":
        hp = True
        sub = pick(rng, [(3, "f32"), (7, "quants")])
        case.label += "/" + sub
        if sub == "f32":
            t = rng.choice([x for x in g["tensors"] if x["type"] == 0])
            v = rng.choice([float("nan"), float("inf"), -float("inf")])
            o = g["data"] + t["offset"] + 4 * rng.randrange(tensor_elems(t))
            case.refuse("non-finite weight in %s" % t["name"], names=[t["name"]])
            patch = struct.pack("<f", v)
        else:  # quants only (never an f16 scale): other weights, a finite model
            t = rng.choice([x for x in g["tensors"] if x["type"] in QUANT_PAYLOAD])
            bs, (lo, hi) = QUANT_PAYLOAD[t["type"]]
            nblocks = tensor_elems(t) // (256 if t["type"] in (12, 14) else 32)
            blk = rng.randrange(nblocks)
            n = rng.randint(1, hi - lo)
            o = g["data"] + t["offset"] + blk * bs + rng.randrange(lo, hi - n + 1)
            patch = bytes(rng.getrandbits(8) for _ in range(n))
            case.label += "/" + ("embd" if "token_embd" in t["name"] else "blk")
        f = Spliced([(src, 0, o), patch, (src, o + len(patch), size - o - len(patch))])
    else:  # truncate
        cut = rng.randrange(0, size) if rng.random() < 0.7 else rng.randrange(0, g["data"] + 1)
        f = Spliced([(src, 0, cut)])
        case.refuse("truncated GGUF (%d of %d bytes)" % (cut, size))
    case.files["f.gguf"] = f
    F = "{D}/f.gguf"
    if pick(rng, [(45, "tokenize"), (55, "generate")]) == "tokenize":
        case.argv = ["tokenize", "-m", F, "-p", rng.choice(PROMPTS)]
        if rng.random() < 0.3:
            case.argv.append("--json")
        if hp and m not in ("tensor-info", "tensor-data"):
            case.must_refuse = None  # tokenize reads the vocabulary only
            case.refuse_names = []
        if m in ("tensor-data", "tensor-info"):
            case.must_refuse = None  # tensor data and shapes: tokenize checks only that tensors lie in the file
            case.refuse_names = []
        case.timeout_scale = 2.0
    else:
        case.argv = ["generate", "-m", F, "-i", rng.choice(["Hello", "Once upon a time", "The capital of France is"]),
                     "-n", "8", "-t", "0", "--threads", "1"]
        case.timeout_scale = 2.0


def gen_model_command(base, rng, case, c, F, tok=None, vocab_only=False, bpe=False, gguf=False):
    """Runs subcommand `c` with model file F (and --tokenizer `tok`)."""
    z = ["--tokenizer", tok] if tok else []
    if c == "generate":
        case.argv = ["generate", "--model", F] + z + ["-t", "0", "--steps", str(rng.choice([8, 16, 24]))]
        if rng.random() < 0.7:
            case.argv += ["--prompt", rng.choice(PROMPTS)]
        if rng.random() < 0.2:
            case.argv += ["--keep", "0.5"]
        if vocab_only:
            case.refuse("a vocabulary-only GGUF has no weights")
            case.refuse_names = []  # the first fault the program meets may be another
    elif c == "perplexity":
        case.argv = ["perplexity", "--model", F] + z + ["--text", base.small, "--context", "32", "--windows", "2"]
        if rng.random() < 0.4:
            case.argv += ["--json"]
    elif c == "tokenize":
        case.argv = ["tokenize", "-m", F] + (["-z", tok] if tok else [])
        if rng.random() < 0.6:
            case.argv += ["-p", rng.choice(PROMPTS)]
        else:
            case.argv += ["--text-file", base.small]
        for f in ("--special", "--no-bos", "--json"):
            if rng.random() < 0.3 and (bpe or f != "--special"):  # --special: byte-level BPE vocabularies only
                case.argv.append(f)
    elif c == "profile":
        case.argv = ["profile", "--model", F] + z + ["--text", base.small, "--context", "32", "--continuation", "8",
                                                     "--windows", "1", "--sinks", "2", "--recent", "4",
                                                     "--obs-window", "4", "--scorers", "h2o", "-o", "{D}/out.json"]
        case.outputs.append("{D}/out.json")
        case.json_outputs.append("{D}/out.json")
        case.expect_stdout = False
    else:  # eval, with a small profile measured on another model file: refused unless the model is the same
        case.refuse_names = []  # a changed model file is refused first as another model than the profile's
        case.argv = ["eval", "--model", F] + z + ["--profile", base.sprof_gguf if gguf else base.sprof, "--text",
                                                  base.small, "--windows", "1", "--keeps", "0.5"]


# ----------------------------------------------------------------------------------------------
# Kind: llama2c (.bin checkpoints and tok512.bin tokenizers)
# ----------------------------------------------------------------------------------------------

HEADER = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"]
LIMITS = {"dim": 65536, "hidden_dim": 262144, "n_layers": 1024, "n_heads": 1024, "n_kv_heads": 1024,
          "vocab_size": 1 << 20, "seq_len": 1 << 20}


def llama2c_layout(h):
    """(name, n floats) of the tensors of a v0 checkpoint with header h, in file order."""
    dim, hidden, L, H, KV, V, S = h
    hs = dim // H
    kvd = hs * KV
    out = [("token_embedding", abs(V) * dim), ("rms_att", L * dim), ("wq", L * dim * dim), ("wk", L * kvd * dim),
           ("wv", L * kvd * dim), ("wo", L * dim * dim), ("rms_ffn", L * dim), ("w1", L * hidden * dim),
           ("w2", L * hidden * dim), ("w3", L * hidden * dim), ("rms_final", dim), ("freq_cis_real", S * hs // 2),
           ("freq_cis_imag", S * hs // 2)]
    if V < 0:
        out.append(("wcls", abs(V) * dim))
    return out


def llama2c_size(h):
    dim, hidden, L, H, KV, V, S = h
    if min(dim, hidden, L, H, KV, S) <= 0 or V == 0 or dim % H or (dim // H) % 2 or KV > H or H % KV:
        return None
    return 28 + 4 * sum(n for _, n in llama2c_layout(h))


def gen_llama2c(base, rng, case):
    target = pick(rng, [(50, "stories"), (25, "aidreams"), (25, "tokenizer")])
    if target == "tokenizer":
        return gen_tok512(base, rng, case)
    src, tok = (base.sbin, base.stok) if target == "stories" else (base.abin, base.atok)
    orig = base.read(src)
    b = bytearray(orig)
    h = list(struct.unpack_from("<7i", b, 0))
    m = pick(rng, [(30, "header"), (15, "truncate"), (20, "weights"), (15, "bitflip"), (8, "append"), (7, "tiny"),
                   (5, "gguf-magic")])
    if case.control:
        m = "control"
    case.label = "llama2c/" + m
    if m == "control":
        case.same({"model.bin": orig, "tok512.bin": base.read(tok)})
    elif m == "header":
        i = rng.randrange(7)
        old = h[i]
        v = rng.choice([0, -1, I32_MIN, I32_MAX, 1, old + 1, old - 1, old * 2, old // 2, -old, 10 ** 6, 3])
        h[i] = v
        put(b, 4 * i, "i", v)
        case.label += "/" + HEADER[i]
        need = llama2c_size(h)
        if v != old and (need is None or need != len(b) or v > LIMITS[HEADER[i]]):
            case.refuse("header %s %d -> %d (file size %d, the header implies %s)" % (HEADER[i], old, v, len(b), need))
    elif m == "truncate":
        cut = rng.randrange(0, len(b))
        b = b[:cut]
        case.refuse("truncated checkpoint")
    elif m == "weights":
        layout = llama2c_layout(h)
        name, n = rng.choice([x for x in layout if not x[0].startswith("freq")])
        off = 28 + 4 * sum(k for nm, k in layout[:[x[0] for x in layout].index(name)])
        v = rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e30, 1e20])
        whole = rng.random() < 0.5
        pv = struct.pack("<f", v)
        for j in (range(n) if whole else [rng.randrange(n)]):
            b[off + 4 * j:off + 4 * j + 4] = pv
        case.label += "/%s/%s" % ("whole" if whole else "one", "%g" % v)
        if not math.isfinite(v):
            case.refuse("non-finite weight in %s" % name)
    elif m == "bitflip":
        flip_bits(b, rng, rng.randint(1, 16), 28)
    elif m == "append":
        b += bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 4, 1000])))
        case.refuse("trailing bytes after the checkpoint")
    elif m == "tiny":
        b = b[:rng.choice([0, 1, 4, 27])]
        case.refuse("file shorter than the header")
    else:
        b[0:4] = b"GGUF"
        case.refuse("GGUF magic on a llama2.c checkpoint")
    case.files["model.bin"] = bytes(b)
    case.files["tok512.bin"] = base.read(tok)
    c = pick(rng, [(45, "generate"), (30, "perplexity"), (10, "tokenize"), (10, "profile"), (5, "eval")])
    if c == "eval" and target != "stories":
        c = "perplexity"
    case.n_vocab = 512
    gen_model_command(base, rng, case, c, "{D}/model.bin")
    if c == "tokenize":
        case.must_refuse = None  # tokenize may read only what the tokenizer needs from the model file


def gen_tok512(base, rng, case):
    src = rng.choice([base.stok, base.atok])
    model = base.sbin if src == base.stok else base.abin
    orig = base.read(src)
    b = bytearray(orig)
    offs = []  # (score offset, length offset, bytes offset, length)
    o = 4
    while o < len(b):
        n = struct.unpack_from("<i", b, o + 4)[0]
        offs.append((o, o + 4, o + 8, n))
        o += 8 + n
    m = pick(rng, [(12, "max_len"), (25, "length"), (15, "score"), (15, "truncate"), (15, "bitflip"), (8, "bytes"),
                   (5, "append"), (5, "tiny")])
    if case.control:
        m = "control"
    case.label = "tok512/" + m
    if m == "control":
        case.same({"tok.bin": orig})
    elif m == "max_len":
        v = rng.choice([0, -1, 1, 2, I32_MAX, I32_MIN, 1000])
        put(b, 0, "i", v)
        if v <= 0:
            case.refuse("max_token_length %d" % v)
    elif m == "length":
        so, lo, bo, n = rng.choice(offs)
        v = rng.choice([-1, I32_MIN, I32_MAX, n + 1, n + 100000, 0, 10 ** 6])
        put(b, lo, "i", v)
        if v < 0 or v > len(b):
            case.refuse("token length %d" % v)
    elif m == "score":
        for _ in range(rng.choice([1, 10, 512])):
            so = rng.choice(offs)[0]
            put(b, so, "f", rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, -3e38]))
    elif m == "truncate":
        b = b[:rng.randrange(0, len(b))]
        case.refuse("truncated tokenizer (fewer than the model's 512 tokens)")
    elif m == "bitflip":
        flip_bits(b, rng, rng.randint(1, 8))
    elif m == "bytes":
        so, lo, bo, n = rng.choice([x for x in offs if x[3] > 0])
        for j in range(n):
            b[bo + j] = rng.choice([0x00, 0xff, 0xc3, 0x80, 0x20])
    elif m == "append":
        b += bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 3, 8, 100])))
    else:
        b = b[:rng.choice([0, 1, 3, 4, 7])]
        case.refuse("tokenizer file of %d bytes" % len(b))
    case.files["tok.bin"] = bytes(b)
    case.n_vocab = 512
    c = pick(rng, [(40, "tokenize"), (30, "generate"), (30, "perplexity")])
    gen_model_command(base, rng, case, c, model, tok="{D}/tok.bin")


# ----------------------------------------------------------------------------------------------
# Kind: tokens (--tokens files)
# ----------------------------------------------------------------------------------------------

def gen_tokens(base, rng, case):
    ids = list(base.small_ids)
    m = pick(rng, [(15, "bad-id"), (12, "garbage"), (10, "separators"), (8, "empty"), (8, "short"), (8, "long"),
                   (8, "huge-number"), (6, "binary"), (6, "same"), (5, "path"), (14, "valid")])
    if case.control:
        m = "valid"
    case.label = "tokens/" + m
    text = None
    plain = {"t.tok": (" ".join(str(x) for x in ids) + "\n").encode()}  # as base.small_tokens
    if m == "bad-id":
        bad = rng.choice(["-1", "512", "513", "-2147483648", "2147483647", "2147483648", "-0", "4294967296",
                          "9223372036854775807", "-9223372036854775808", "1000000"])
        toks = [str(x) for x in ids]
        for _ in range(rng.choice([1, 3])):
            toks[rng.randrange(len(toks))] = bad
        text = " ".join(toks)
        if bad != "-0":
            case.refuse("token id %s outside [0, 512)" % bad)
        case.label += "/" + bad
    elif m == "garbage":
        bad = rng.choice(["1.5", "1e3", "abc", "0x10", "--1", "\u0661\u0662", "1_000", "NaN", "inf", "3-4",
                          "\"5\"", "5;", "0b1", "٣"])
        toks = [str(x) for x in ids]
        toks[rng.randrange(len(toks))] = bad
        text = " ".join(toks)
        case.refuse("'%s' is not a token id" % bad)
        case.label += "/" + bad
    elif m == "separators":
        sep = rng.choice([",", ", ", ",,", "\t", "\r\n", "\n\n", " , ", ";", "\x00", "\x0b", "\x0c", "|"])
        text = sep.join(str(x) for x in ids)
        if sep in (";", "\x00", "|"):
            case.refuse("separator %r" % sep)
        else:
            case.same(plain)  # commas and white space separate ids alike
        case.label += "/%r" % sep
    elif m == "empty":
        text = rng.choice(["", " ", "\n", ",", ",,,", "\t\n ", "\r\n"])
        case.refuse("no token ids")
    elif m == "short":
        k = rng.choice([1, 2, 5, 20, 31, 39, 71])
        text = " ".join(str(x) for x in ids[:k])
    elif m == "long":
        reps = rng.choice([100, 1000])
        text = " ".join(str(x) for x in ids) * 1 + (" " + " ".join(str(x) for x in ids)) * (reps - 1)
    elif m == "huge-number":
        text = " ".join(str(x) for x in ids[:100]) + " " + "9" * rng.choice([20, 100, 10000]) + " 1"
        case.refuse("an id with many digits")
    elif m == "binary":
        raw = bytes(rng.getrandbits(8) for _ in range(rng.choice([10, 1000, 100000])))
        case.files["t.tok"] = raw
        case.refuse("binary token file")
    elif m == "same":
        text = " ".join([str(rng.choice([0, 1, 2, 511]))] * rng.choice([100, 5000]))
    elif m == "valid":
        text = " ".join(str(x) for x in ids) + "\n" if case.control else ", ".join(str(x) for x in ids)
        case.same(plain)
    else:
        which = rng.choice(["missing", "dir", "devnull", "empty-name"])
        p = {"missing": "{D}/nope.tok", "dir": "{D}/adir", "devnull": "/dev/null", "empty-name": ""}[which]
        if which == "dir":
            case.dirs.append("adir")
        if which in ("missing", "dir"):
            case.paths_in_msg.append(p)
        case.refuse("token file: %s" % which)
        case.label += "/" + which
    if text is not None:
        case.files["t.tok"] = text.encode()
    T = "{D}/t.tok" if m != "path" else p
    c = pick(rng, [(40, "perplexity"), (30, "eval"), (30, "profile")])
    if m == "short" and k < {"perplexity": 32, "eval": 72, "profile": 40}[c]:
        case.refuse("%d tokens: fewer than one window of %s" % (k, c))
    model = base.sgguf if rng.random() < 0.15 else base.sbin
    if c == "perplexity":
        case.argv = ["perplexity", "--model", model, "--tokens", T, "--context", "32", "--windows",
                     rng.choice(["1", "2"] if m == "long" else ["1", "2", "0"])]
        if rng.random() < 0.4:
            case.argv += ["--json"]
    elif c == "eval":
        case.argv = ["eval", "--model", base.sbin, "--profile", base.sprof, "--tokens", T, "--windows", "1", "--skip",
                     "0", "--keeps", "0.5", "--policies", "uniform,optimal"]
        if rng.random() < 0.3:
            case.argv += ["--json"]
    else:
        case.argv = ["profile", "--model", model, "--tokens", T, "--context", "32", "--continuation", "8",
                     "--windows", "1", "--sinks", "2", "--recent", "4", "--obs-window", "4", "--scorers", "h2o",
                     "-o", "{D}/out.json"]
        case.outputs.append("{D}/out.json")
        case.json_outputs.append("{D}/out.json")
        case.expect_stdout = False


# ----------------------------------------------------------------------------------------------
# Kind: text (--text, --text-file, --prompt)
# ----------------------------------------------------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf",
                b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xbf\xbf"]
EXOTIC = ["\U0001F600" * 5, "e\u0301\u0301\u0301", "\u202eabc\u202c", "\u4e2d\u6587\u6d4b\u8bd5",
          "\uFEFF", "\u0000", "\u200b" * 10, "\u0130\u0131", "\u00df" * 50, "\r\n", "\t" * 100]


def gen_text(base, rng, case):
    small = base.small_text_bytes
    m = pick(rng, [(12, "invalid-utf8"), (10, "binary"), (8, "empty"), (10, "exotic"), (10, "huge-line"),
                   (6, "nul"), (8, "flips"), (8, "blank-lines"), (6, "no-opening"), (6, "path"), (8, "tiny"),
                   (8, "valid")])
    if case.control:
        m = "valid"
    case.label = "text/" + m
    data = None
    few_tokens = False
    if m == "invalid-utf8":
        b = bytearray(small)
        for _ in range(rng.choice([1, 10, 100])):
            i = rng.randrange(len(b))
            b[i:i] = rng.choice(INVALID_UTF8)
        data = bytes(b) if rng.random() < 0.8 else bytes(b) + rng.choice([b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98"])
    elif m == "binary":
        data = bytes(rng.getrandbits(8) for _ in range(rng.choice([16, 1000, 20000])))
    elif m == "empty":
        data = rng.choice([b"", b"\n", b" ", b"\n\n\n", b"\r\n", b"\t"])
        few_tokens = True
    elif m == "exotic":
        parts = [small.decode(errors="replace")[:2000]]
        for _ in range(rng.choice([1, 5, 30])):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(EXOTIC))
        data = "".join(parts).encode("utf-8", errors="surrogatepass")
    elif m == "huge-line":
        unit = rng.choice([b"a", b"ab ", b"Once upon a time ", b"\xe4\xb8\xad", b"!!", b"1234567890", b"  ",
                           b"\xf0\x9f\x98\x80"])
        n = rng.choice([10 ** 4, 10 ** 5, 3 * 10 ** 5, 10 ** 6])
        data = (unit * (n // len(unit) + 1))[:n]
        case.label += "/%d" % n
    elif m == "nul":
        b = bytearray(small)
        for _ in range(rng.choice([1, 20])):
            b[rng.randrange(len(b))] = 0
        data = bytes(b)
    elif m == "flips":
        b = bytearray(small)
        flip_bits(b, rng, rng.choice([1, 10, 200]))
        data = bytes(b)
    elif m == "blank-lines":
        tail = small[:500] if rng.random() < 0.5 else b""
        data = b"\n" * rng.choice([100, 10000]) + tail
        few_tokens = False  # newlines are tokens too
    elif m == "no-opening":
        data = small.replace(b"Once upon a time", b"Long ago")
    elif m == "tiny":
        data = small[:rng.choice([1, 5, 12, 20])]
        few_tokens = True
    elif m == "valid":
        data = small
        case.same({"t.txt": small})
    if data is not None:
        case.files["t.txt"] = data
        T = "{D}/t.txt"
    else:
        which = rng.choice(["missing", "dir", "devnull"])
        T = {"missing": "{D}/nope.txt", "dir": "{D}/adir", "devnull": "/dev/null"}[which]
        if which == "dir":
            case.dirs.append("adir")
        if which != "devnull":
            case.paths_in_msg.append(T)
        case.label += "/" + which
        few_tokens = which == "devnull"
        if which != "devnull":
            case.refuse("text file: %s" % which)
    c = pick(rng, [(40, "tokenize"), (22, "perplexity"), (13, "profile"), (10, "eval"), (10, "generate"),
                   (5, "analyze")])
    if c == "generate" and (data is None or b"\x00" in data or len(data) > 4000):
        c = "tokenize"
    if c == "tokenize":
        v = pick(rng, [(30, "stories"), (20, "llama-spm"), (10, "phi-3"), (25, "gpt-2"), (7, "llama-bpe"),
                       (8, "qwen2")])
        model = base.sbin if v == "stories" else base.vocabs[v]
        if v in ("llama-bpe", "qwen2"):
            case.timeout_scale = 3.0
        case.argv = ["tokenize", "-m", model, "--text-file", T]
        case.n_vocab = 512 if v == "stories" else gguf_kv(base.gguf(model), "tokenizer.ggml.tokens")["count"]
        for f in ("--special", "--no-bos", "--json"):
            if rng.random() < 0.3 and (v in BPE_VOCABS or f != "--special"):
                case.argv.append(f)
        if few_tokens:
            case.expect_stdout = "--json" in case.argv
        case.label += "/" + v
    elif c == "perplexity":
        model = base.sgguf if rng.random() < 0.2 else base.sbin
        case.argv = ["perplexity", "--model", model, "--text", T, "--context", "32", "--windows", "1"]
        if few_tokens:
            case.refuse("text too short for one window")
    elif c == "profile":
        case.argv = ["profile", "--model", base.sbin, "--text", T, "--context", "32", "--continuation", "8",
                     "--windows", "1", "--sinks", "2", "--recent", "4", "--obs-window", "4", "--scorers", "h2o",
                     "-o", "{D}/out.json"]
        if rng.random() < 0.3:
            case.argv += ["--doc-separator", rng.choice(["", "\n\n", "XYZ"])]
            if case.argv[-1] == "XYZ" and case.control:
                case.argv[-1] = "\n\n"
            elif case.argv[-1] == "XYZ":  # a separator the text need not hold: refused, or not a neutral case
                case.expect, case.valid, case.base_files = None, False, None
        case.outputs.append("{D}/out.json")
        case.json_outputs.append("{D}/out.json")
        case.expect_stdout = False
        if few_tokens:
            case.refuse("text too short for one window")
    elif c == "eval":
        case.argv = ["eval", "--model", base.sbin, "--profile", base.sprof, "--text", T, "--windows", "1", "--skip",
                     "0", "--keeps", "0.5", "--policies", "uniform,optimal"]
        if few_tokens:
            case.refuse("text too short for one window")
    elif c == "analyze":
        case.argv = ["analyze", "--model", base.sbin, "--profile", base.sprof, "--text", T, "--samples", "4",
                     "--max-tokens", "32", "--batch", "4", "--recompute"]
        if few_tokens:
            case.refuse("text too short for 4 probe stories")
    else:
        case.argv = ["generate", "--model", base.sbin, "-t", "0", "--steps", "0", "--prompt",
                     os.fsdecode(data)]
        case.label += "/prompt"


# ----------------------------------------------------------------------------------------------
# Kind: cli (option values, paths, outputs)
# ----------------------------------------------------------------------------------------------

def parse_int(s):
    """An integer as CLI11 reads one (decimal, or 0x / 0o / 0b prefixed), else None."""
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F]+|[+-]?0[oO][0-7]+|[+-]?0[bB][01]+", s):
        return int(s, 0)
    return None


def as_float(s):
    try:
        return float(s)
    except ValueError:
        return None


# option -> (type, predicate on the parsed value: True valid, False must refuse, None no rule)
def _i(lo, hi=I32_MAX, grey=None):
    def f(v):
        if grey and grey(v):
            return None
        return lo <= v <= hi
    return ("int", f)


def _f(pred):
    return ("float", pred)


OPTS = {
    "--steps": _i(0),
    "--temperature": _f(lambda v: math.isfinite(v) and v >= 0),
    "--topp": _f(lambda v: 0 <= v <= 1),
    "--seed": ("uint", lambda v: 0 <= v < 2 ** 32 or (None if v < 2 ** 64 else False)),
    "--keep": _f(lambda v: 0 < v <= 1), "--keeps": _f(lambda v: 0 < v <= 1),
    "--layer-keep": _f(lambda v: 0 < v < 1),
    "--sinks": _i(0), "--recent": _i(0), "--obs-window": _i(1),
    "--kernel": ("int", lambda v: v >= 1 and v % 2 == 1),
    "--head-alpha": _f(lambda v: 0 <= v <= 1),
    "--lookahead": _i(0, 512, grey=lambda v: 400 < v <= 512),
    "--chunk": _i(1), "--max-kv-tokens": _i(1), "--interval": _i(1), "--threads": _i(0, I32_MAX,
                                                                                     grey=lambda v: v > 64),
    "--context": _i(1, 512, grey=lambda v: v in (1, 2)),
    "--continuation": _i(2, 512, grey=lambda v: v > 400),
    "--windows": _i(1), "--skip": _i(0), "--min-tokens": _i(-1), "--length": _i(1),
    "--samples": _i(1), "--tau": _f(lambda v: math.isfinite(v) and v > 0), "--batch": _i(2, I32_MAX,
                                                                                       grey=lambda v: v == 1),
    "--max-tokens": _i(0), "--probe-samples": _i(0),
}

BAD_VALUES = ["-1", "0", "1", "-2147483648", "2147483647", "2147483648", "-2147483649", "9223372036854775808",
              "99999999999999999999", "1e9", "nan", "-nan", "inf", "-inf", "1e308", "1e-320", "-0", "0.5", "abc",
              "", "0x10", " 7", "7 ", "1,2", "+3", "1e400", "3", "100000"]


def cli_base(base, sub):
    """A valid, fast command of subcommand `sub`: (argv, numeric options it takes, file inputs, outputs)."""
    S, P, T = base.sbin, base.sprof, base.small
    sel = ["--sinks", "--recent", "--obs-window", "--kernel", "--head-alpha", "--lookahead"]
    if sub == "generate":
        return (["generate", "--model", S, "--temperature", "0", "--steps", "16", "--prompt", "Once upon a time", "--keep", "0.5",
                 "--profile", P, "--policy", "optimal"],
                ["--steps", "--temperature", "--topp", "--seed", "--keep", "--chunk", "--max-kv-tokens", "--interval",
                 "--threads"] + sel, ["--model", "--profile", "--tokenizer"], [])
    if sub == "profile":
        return (["profile", "--model", S, "--text", T, "--context", "32", "--continuation", "8", "--windows", "1",
                 "--sinks", "2", "--recent", "4", "--obs-window", "4", "--scorers", "h2o", "-o", "{D}/out.json"],
                ["--context", "--continuation", "--windows", "--skip", "--probe-samples", "--chunk", "--threads"] + sel,
                ["--model", "--text", "--tokenizer"], ["-o"])
    if sub == "allocate":
        return (["allocate", "--profile", P, "--keep", "0.5"], ["--keep", "--length", "--min-tokens"] + sel,
                ["--profile"], [])
    if sub == "eval":
        return (["eval", "--model", S, "--profile", P, "--text", T, "--windows", "1", "--keeps", "0.5", "--policies",
                 "uniform,optimal"],
                ["--keeps", "--context", "--continuation", "--windows", "--skip", "--min-tokens", "--chunk",
                 "--interval", "--threads"] + sel,
                ["--model", "--profile", "--text", "--tokenizer"], ["--csv", "--plot", "--windows-out"])
    if sub == "analyze":
        return (["analyze", "--model", S, "--profile", P, "--text", T, "--samples", "4", "--max-tokens", "32",
                 "--batch", "4", "--recompute"],
                ["--samples", "--skip", "--layer-keep", "--tau", "--batch", "--seed", "--max-tokens", "--threads"],
                ["--model", "--profile", "--text", "--tokenizer"], ["--write"])
    if sub == "tokenize":
        return (["tokenize", "-m", S, "--text-file", T], [], ["-m", "--text-file", "-z"], [])
    return (["perplexity", "--model", S, "--text", T, "--context", "32", "--windows", "2"],
            ["--context", "--windows", "--chunk", "--threads"], ["--model", "--text", "--tokenizer"], [])


def drop_opt(argv, opt):
    if opt in argv:
        i = argv.index(opt)
        return argv[:i] + argv[i + 2:]
    return argv


def exercise(argv, sub, opt):
    """Adds what makes `opt` matter in a command of `sub` (and drops what excludes it)."""
    if sub == "generate" and opt in ("--max-kv-tokens", "--interval"):
        for o in ("--keep", "--profile", "--policy"):
            argv = drop_opt(argv, o)
        if "--max-kv-tokens" not in argv:
            argv = argv + ["--max-kv-tokens", "64"]
    if sub == "eval" and opt == "--interval" and "--schedule" not in argv:
        argv = argv + ["--schedule", "decode"]
    if opt == "--head-alpha" and "--head-alloc" not in argv:
        argv = argv + ["--head-alloc", "adaptive"]
    if sub == "profile" and opt == "--probe-samples" and "--metrics" not in argv:
        argv = argv + ["--metrics", "kl,infonce"]
    return argv


def set_opt(argv, opt, val):
    argv = list(argv)
    if opt in argv:
        argv[argv.index(opt) + 1] = val
    else:
        argv += [opt, val]
    return argv


def value_rule(opt, s, sub):
    """Whether value string `s` of `opt` must be refused (True), is valid (False) or has no rule (None)."""
    typ, pred = OPTS[opt]
    if opt == "--skip" and sub == "analyze":
        pred = lambda v: v >= -1  # noqa: E731
    if opt == "--windows" and sub == "perplexity":
        pred = lambda v: v >= 0  # noqa: E731
    if opt in ("--context", "--continuation") and sub in ("profile", "eval"):
        pred0 = pred
        pred = lambda v: pred0(v) and (v <= 400)  # noqa: E731  context + continuation within 512
    st = s.strip()
    if typ in ("int", "uint"):
        v = parse_int(st)
        if v is None:
            return True if as_float(st) is None or not math.isfinite(as_float(st)) else None
        if typ == "int" and not (I32_MIN <= v <= I32_MAX):
            return True
    else:
        v = as_float(st) if parse_int(st) is None else float(parse_int(st))
        if v is None or st == "":
            return True
    ok = pred(v)
    return None if ok is None else not ok


def gen_cli(base, rng, case):
    sub = pick(rng, [(18, "generate"), (14, "profile"), (16, "allocate"), (16, "eval"), (10, "analyze"),
                     (8, "tokenize"), (18, "perplexity")])
    argv, opts, inputs, outputs = cli_base(base, sub)
    m = pick(rng, [(60 if opts else 0, "value"), (8 if opts else 0, "two-values"), (12, "path"),
                   (8 if outputs else 0, "output"), (5, "stdout-full"), (7, "list")])
    if case.control:
        m = "control"
    case.label = "cli/%s/%s" % (sub, m)
    if sub == "tokenize":
        case.n_vocab = 512
    if m == "control":
        case.same({})
    elif m in ("value", "two-values"):
        for opt in rng.sample(opts, 1 if m == "value" else 2):
            val = rng.choice(BAD_VALUES)
            argv = exercise(argv, sub, opt)
            argv = set_opt(argv, opt, val)
            r = value_rule(opt, val, sub)
            if r:
                case.refuse("%s %r" % (opt, val))
            case.label = "cli/%s/%s" % (sub, opt)
            if opt == "--lookahead" and val not in ("", "abc"):
                case.timeout_scale = 2.0
    elif m == "path":
        opt = rng.choice(inputs)
        which = rng.choice(["missing", "dir", "devnull", "empty-name", "other-file"])
        other = base.small if opt in ("--model", "-m", "--tokenizer", "-z", "--profile") else base.sbin
        p = {"missing": "{D}/nope.bin", "dir": "{D}/adir", "devnull": "/dev/null", "empty-name": "",
             "other-file": other}[which]
        if which == "dir":
            case.dirs.append("adir")
        if which in ("missing", "dir"):
            case.paths_in_msg.append(p)
        argv = set_opt(argv, opt, p)
        optional = opt in ("--tokenizer", "-z") or (opt == "--profile" and sub == "generate")
        if which == "other-file" and opt in ("--text", "--text-file"):
            pass  # a binary file is text too
        elif which == "devnull" and opt == "--text-file":
            case.expect_stdout = False  # tokenizing nothing
        elif which == "empty-name" and optional:
            pass  # '' means: not given
        else:
            case.refuse("%s: %s" % (opt, which))
        case.label = "cli/%s/%s=%s" % (sub, opt, which)
    elif m == "output":
        opt = rng.choice(outputs)
        which = rng.choice(["/dev/full", "dir", "no-parent"] + (["empty-name"] if opt == "-o" else []))
        p = {"/dev/full": "/dev/full", "dir": "{D}/adir", "no-parent": "{D}/no/such/dir/x.out", "empty-name": ""}[which]
        if which == "dir":
            case.dirs.append("adir")
        argv = set_opt(argv, opt, p)
        case.refuse("output %s to %s" % (opt, which))
        case.label = "cli/%s/%s=%s" % (sub, opt, which)
    elif m == "stdout-full":
        case.stdout_full = True
        case.expect_stdout = False
        if sub != "profile":
            case.refuse("stdout is /dev/full: writing the result fails")
    else:
        choices = {
            "generate": [("--policy", ["bogus", "", "optimal,uniform"]), ("--scorer", ["bogus", ""]),
                         ("--pooling", ["bogus", ""]), ("--head-alloc", ["bogus"]), ("--preset", ["bogus", ""])],
            "profile": [("--scorers", ["", "bogus", ",", "h2o,h2o", "h2o,bogus"]),
                        ("--ratios", ["", "0.5,0.1", "0,0.5", "0.1,1.5", "0.1,nan", "0.1,,0.2", "-0.1", "inf", "0.1,0.1"]),
                        ("--metrics", ["bogus", "", "kl,kl"]), ("--schedule", ["bogus", ""]),
                        ("--doc-opening", [""]), ("--doc-separator", ["", "\n"])],
            "allocate": [("--policy", ["bogus", ""]), ("--scorer", ["bogus", ""]), ("--preset", ["bogus", "best"])],
            # '' for --scorer / --scorers: the option's own default (not given)
            "eval": [("--keeps", ["", "0.1,,0.2", "0.1,nan", "0,0.5", "1.5", "0.5,0.5", ","]),
                     ("--policies", ["", "bogus", "uniform,bogus", ","]), ("--scorers", ["", "bogus"]),
                     ("--schedule", ["bogus", ""])],
            "analyze": [("--bogus-flag", ["1"])],
            "tokenize": [("-p", ["", "x" * 100000, "\u00ff\u00fe"]), ("--bogus-flag", ["1"])],
            "perplexity": [("--bogus-flag", ["1"]), ("--tokens", ["{D}/nope.tok"])],
        }[sub]
        opt, vals = rng.choice(choices)
        val = rng.choice(vals)
        argv = set_opt(argv, opt, val)
        case.label = "cli/%s/%s" % (sub, opt)
        valid = {("--scorers", "h2o,h2o"), ("--metrics", "kl,kl"), ("--doc-separator", "\n"), ("--doc-opening", ""),
                 ("--doc-separator", ""), ("--preset", "best"), ("-p", "x" * 100000), ("-p", "\u00ff\u00fe"),
                 ("-p", ""), ("--keeps", "0.5,0.5"), ("--ratios", "0.1,0.1"), ("--scorers", ","),
                 ("--policies", ","), ("--scorer", ""), ("--scorers", "")}
        if (opt, val) not in valid:
            case.refuse("%s %r" % (opt, val))
        if opt == "--preset" and val == "best":
            case.must_refuse = "--preset best with a profile without head curves"
    case.argv = argv
    if "-o" in argv and argv[argv.index("-o") + 1] == "{D}/out.json":
        case.outputs.append("{D}/out.json")
        case.json_outputs.append("{D}/out.json")
    if sub == "profile":
        case.expect_stdout = False


GENERATORS = {"profile": gen_profile, "gguf": gen_gguf, "llama2c": gen_llama2c, "tokens": gen_tokens,
              "text": gen_text, "cli": gen_cli, "realgguf": gen_realgguf,
              "realprofile": lambda base, rng, case: gen_profile(base, rng, case, real=True)}


def make_case(base, seed, kind, index, control=False):
    """Case `index` of `kind` (a pure function of the seed, the kind and the index); with `control`,
    control case `index`: an unmutated valid input, which must succeed."""
    control = control or CONTROL
    rng = random.Random(("%d:%s:%d" if not control else "%d:%s:control:%d") % (seed, kind, index))
    case = Case(kind, index, kind)
    case.control = control
    GENERATORS[kind](base, rng, case)
    if control:
        case.valid = True
        assert case.expect == "same" and not case.must_refuse, (kind, index, case.label, case.must_refuse)
    return case


# ----------------------------------------------------------------------------------------------
# Answer checks: the unmutated input's output (expect "same") and per-subcommand properties
# ----------------------------------------------------------------------------------------------

def llround(x):
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def argv_value(argv, *names):
    for n in names:
        if n in argv and argv.index(n) + 1 < len(argv):
            return argv[argv.index(n) + 1]
    return None


def number_value(s):
    if s is None:
        return None
    st = s.strip()
    v = parse_int(st)
    return float(v) if v is not None else as_float(st)


def finite_numbers(o, where="stdout"):
    """The first non-finite number of a parsed JSON value, or None."""
    for p, v in json_paths(o):
        if isinstance(v, float) and not math.isfinite(v):
            return "%s: %s is %r" % (where, "/".join(map(str, p)), v)
    return None


def allocate_answer(argv, out):
    """(budget rows, total, length, windows, n_kv_heads) from allocate's stdout (--json or the table)."""
    if "--json" in argv:
        j = json.loads(out)
        if "head_budgets" in j:
            return j["head_budgets"], j["total"], j["length"], j.get("layer_window"), j["n_kv_heads"]
        return [[b] for b in j["budgets"]], j["total"], j["length"], j.get("layer_window"), 1
    text = out.decode(errors="replace")
    m = re.search(r"keep [\d.]+ of (\d+) tokens x (\d+) layers(?: x (\d+) KV heads)? = (\d+) tokens", text)
    if not m:
        raise ValueError("no 'keep ... of N tokens x L layers = T tokens' line")
    length, n_layers, heads, total = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1), int(m.group(4))
    rows, windows = [], []
    after = text[m.end():]
    for line in after.splitlines():
        f = line.split()
        if len(f) >= 2 and all(x.lstrip("-").isdigit() for x in f[:2]) and int(f[0]) == len(rows):
            if heads > 1 or "per KV head" in after[:200]:
                rows.append([int(x) for x in f[1:1 + heads]])
            else:
                rows.append([int(f[1])])
                if len(f) >= 4:
                    windows.append(0 if f[3] == "global" else int(f[3]))
        if len(rows) == n_layers:
            break
    if len(rows) != n_layers:
        raise ValueError("%d budget rows for %d layers" % (len(rows), n_layers))
    return rows, total, length, windows or None, heads


def prop_allocate(case, out):
    """Budgets sum to the total; the total is llround(keep x length x layers [x KV heads]), lowered to
    the caps' sum; every budget lies in [floor, cap] (cap: the length, or window - 1 on a sliding-
    window layer; floor: the protected sinks + recent tokens, capped, when no --preset sets them)."""
    rows, total, length, windows, heads = allocate_answer(case.argv, out)
    L = len(rows)
    if windows is None and isinstance(case.files.get("p.json"), bytes):
        try:  # head-optimal's JSON and table name no windows: the profile's (the program's input)
            lw = json.loads(case.files["p.json"]).get("layer_window")
            if isinstance(lw, list) and len(lw) == L and all(isinstance(w, int) for w in lw):
                windows = lw
        except (ValueError, AttributeError, RecursionError):
            pass
    flat = [b for r in rows for b in r]
    if any(len(r) != heads for r in rows):
        return "a layer without one budget per KV head"
    if sum(flat) != total:
        return "budgets sum to %d, not the total %d" % (sum(flat), total)
    caps = [min(length, w - 1) if windows and w > 0 else length for w in (windows or [0] * L)]
    keep = number_value(argv_value(case.argv, "--keep"))
    if keep is not None and 0 < keep <= 1:
        want = min(llround(keep * length * L * heads), sum(caps) * heads)
        if total != want:
            return "total %d, not llround(%g x %d x %d%s) = %d (capped at %d)" % (
                total, keep, length, L, " x %d" % heads if heads > 1 else "", want, sum(caps) * heads)
    sinks = number_value(argv_value(case.argv, "--sinks")) or (None if "--sinks" in case.argv else 4)
    recent = number_value(argv_value(case.argv, "--recent")) or (None if "--recent" in case.argv else 16)
    protect = "--preset" not in case.argv and sinks is not None and recent is not None
    for l, r in enumerate(rows):
        for b in r:
            if not (0 <= b <= caps[l]):
                return "layer %d budget %d outside [0, %d]" % (l, b, caps[l])
            floor = min(caps[l], int(sinks + recent)) if protect else 0
            if b < floor:
                return "layer %d budget %d below its protected %d tokens" % (l, b, floor)
    return None


def prop_eval(case, out):
    """Finite numbers; KL >= 0; top-1 in [0, 1]; kept bytes <= full bytes; every row of one keep ratio
    spends the same total; no layer keeps more than the context (total / (keep x layers))."""
    rows = json.loads(out)
    bad = finite_numbers(rows)
    if bad:
        return bad
    totals = {}
    for r in rows:
        if r.get("kl", 0) < -1e-9:
            return "KL %g < 0 (%s/%s)" % (r["kl"], r.get("scorer"), r.get("policy"))
        if not (0 <= r.get("top1", 0) <= 1):
            return "top-1 agreement %g outside [0, 1]" % r["top1"]
        if r.get("bytes_kept", 0) > r.get("bytes_full", 0) * (1 + 1e-9):
            return "bytes kept %g > full %g" % (r["bytes_kept"], r["bytes_full"])
        b = r.get("budgets")
        if b is None:
            continue
        if any(not isinstance(x, int) or x < 0 for x in b):
            return "a budget that is not a count"
        totals.setdefault(r["keep"], set()).add(sum(b))
        ctx = sum(b) / (r["keep"] * len(b)) if r["keep"] > 0 and b else None
        if ctx is not None and max(b) > math.ceil(ctx) + 1:
            return "a layer keeps %d of a %g-token context" % (max(b), ctx)
    for k, t in totals.items():
        if len(t) != 1:
            return "keep %g: the policies spend different totals %s" % (k, sorted(t))
    return None


def prop_perplexity(case, out):
    """Finite NLL >= 0; perplexity = exp(NLL); NLL = the mean of the windows' (equal windows)."""
    j = json.loads(out)
    bad = finite_numbers(j)
    if bad:
        return bad
    nll, w = j["nll"], j["window_nll"]
    if nll < 0 or any(x < 0 for x in w):
        return "negative NLL"
    if len(w) != j["windows"]:
        return "%d window NLLs for %d windows" % (len(w), j["windows"])
    if abs(j["ppl"] - math.exp(nll)) > 1e-6 * max(1.0, j["ppl"]):
        return "ppl %r != exp(nll %r)" % (j["ppl"], nll)
    if w and abs(sum(w) / len(w) - nll) > 1e-6 * max(1.0, nll):
        return "nll %r is not the mean of the windows' %r" % (nll, sum(w) / len(w))
    return None


def prop_tokenize(case, out):
    """Every id an integer in [0, n_vocab)."""
    if case.n_vocab is None:
        return None
    if "--json" in case.argv:
        ids = json.loads(out)
        if not isinstance(ids, list) or any(not isinstance(x, int) or isinstance(x, bool) for x in ids):
            return "--json output is not a list of ids"
    else:
        try:
            ids = [int(x) for x in out.split()]
        except ValueError:
            return "output is not token ids"
    for x in ids:
        if not (0 <= x < case.n_vocab):
            return "id %d outside the vocabulary of %d" % (x, case.n_vocab)
    return None


def prop_generate(case, out, err):
    """Pruned runs (--keep): each layer keeps at most the prompt's tokens (stderr's 'per-layer
    tokens ... of N'); every run: text on stdout (W5), no <unk> from greedy decoding (W3)."""
    if "--keep" in case.argv:
        m = re.search(rb"per-layer tokens ([\d ]+) of (\d+)", err)
        if m:
            n = int(m.group(2))
            for x in m.group(1).split():
                if int(x) > n:
                    return "a layer keeps %d of the prompt's %d tokens" % (int(x), n)
    return None


def property_of(case):
    """The property function of the case's subcommand, or None (analyze: no checkable answer)."""
    sub = case.argv[0] if case.argv else ""
    if sub == "allocate":
        return "allocate"
    if sub == "eval" and "--json" in case.argv:
        return "eval"
    if sub == "perplexity" and "--json" in case.argv:
        return "perplexity"
    if sub == "tokenize" and case.n_vocab is not None:
        return "tokenize"
    if sub in ("generate", "profile"):
        return sub
    return None


def check_property(case, r, d, ctx):
    """None, or why the successful run `r` breaks its subcommand's property."""
    which = property_of(case)
    out = r["out"]
    try:
        if which == "allocate":
            return prop_allocate(case, out)
        if which == "eval":
            return prop_eval(case, out)
        if which == "perplexity":
            return prop_perplexity(case, out)
        if which == "tokenize":
            return prop_tokenize(case, out)
        if which == "generate":
            return prop_generate(case, out, r["err"])
        if which == "profile" and ctx is not None:
            # the written profile loads: allocate reads it (with the selection it was measured under)
            path = resolve("{D}/out.json", d)
            if not os.path.isfile(path):
                return "no profile written"
            argv = ["allocate", "--profile", path, "--keep", "1", "--json"]  # keep 1: feasible at any length
            for o in ("--sinks", "--recent", "--obs-window"):
                if argv_value(case.argv, o) is not None:
                    argv += [o, argv_value(case.argv, o)]
            p = subprocess.run([ctx.exe] + argv, capture_output=True, timeout=60)
            if p.returncode != 0:
                return "the written profile does not load: %s" % p.stderr.decode(errors="replace").strip()[-200:]
            check = Case(case.kind, case.index, case.label)
            check.argv = argv
            why = prop_allocate(check, p.stdout)
            return "allocate on the written profile: " + why if why else None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return "%s output not as documented: %s: %s" % (which, type(e).__name__, str(e)[:80])
    return None


def content_key(data):
    if isinstance(data, Spliced):
        return ("spliced",) + data.key()
    return ("bytes", hashlib.sha1(data).hexdigest())


def expected_key(case):
    return json.dumps([case.argv, case.stdout_full, sorted((n, content_key(v)) for n, v in case.base_files.items())])


TIMING_RE = re.compile(rb"(?m)^(time|cost): .*$")
TIMING_JSON_RE = re.compile(rb'"seconds": *[-+0-9.eE]+')


def normalize(data, d):
    """The case folder as {D}; the timings (lines "time: ...", "cost: ...", analyze's JSON "seconds")
    as <timing>."""
    data = TIMING_RE.sub(rb"\1: <timing>", data.replace(os.fsencode(d), b"{D}"))
    return TIMING_JSON_RE.sub(b'"seconds": "<timing>"', data)


def case_outputs(case, d):
    """{output file name: normalized bytes} of a run in folder d."""
    got = {}
    for o in case.outputs:
        path = resolve(o, d)
        got[os.path.basename(path)] = normalize(open(path, "rb").read(), d) if os.path.isfile(path) else None
    return got


def expected_output(case, ctx):
    """(stdout, outputs) of the case's command on its unmutated files: run once per key, then cached;
    (None, reason) when that run did not succeed."""
    key = expected_key(case)
    with ctx.lock:
        if key in ctx.expected:
            return ctx.expected[key]
        lk = ctx.expected_locks.setdefault(key, threading.Lock())
    with lk:
        with ctx.lock:
            if key in ctx.expected:
                return ctx.expected[key]
            ctx.base_runs += 1
            n = ctx.base_runs
        exe, timeout, mem_mb = ctx.args
        bc = Case(case.kind, case.index, case.label)
        bc.files, bc.dirs, bc.argv, bc.outputs = case.base_files, case.dirs, case.argv, case.outputs
        bc.stdout_full, bc.timeout_scale = case.stdout_full, case.timeout_scale
        d = os.path.join(ctx.work, "base-run-%d" % n)
        if os.path.exists(d):
            shutil.rmtree(d)
        r = run_case(bc, exe, d, timeout, mem_mb)
        if r["rc"] == 0 and not r["hung"]:
            have = (normalize(r["out"], d), case_outputs(bc, d))
        else:  # the command refuses the unmutated input too (e.g. an infeasible budget): same refusal
            msg = re.search(rb"depthkv: error: (\S.*)", r["err"]) if r["rc"] == 1 else None
            have = (None, "the unmutated input's run exited %s: %s" % (
                "(hang)" if r["hung"] else r["rc"], r["err"].decode(errors="replace").strip()[-200:]),
                normalize(msg.group(1), d) if msg else None)
        shutil.rmtree(d, ignore_errors=True)
        with ctx.lock:
            ctx.expected[key] = have
        return have


def first_difference(a, b):
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return "byte %d: %r vs %r" % (n, a[max(0, n - 20):n + 30], b[max(0, n - 20):n + 30])


# ----------------------------------------------------------------------------------------------
# Running and classifying
# ----------------------------------------------------------------------------------------------

CRASH_RE = re.compile(rb"AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|"
                      rb"terminate called|Assertion .* failed|Segmentation fault|core dumped|stack smashing|"
                      rb"double free|free\(\): invalid|malloc\(\): ")
NONFINITE_RE = re.compile(rb"(?<![A-Za-z0-9_])-?(nan|inf|infinity|null)(?![A-Za-z0-9_])", re.IGNORECASE)
NONFINITE_CS_RE = re.compile(rb"(?<![A-Za-z0-9_])-?(nan|inf|null)(?![A-Za-z0-9_])")
FLAG_COLON_RE = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)(?=:| must\b| is\b| =| outside\b| out of\b)")
QUOTED_PATH_RE = re.compile(r"'([^']*/[^']*)'")


def strict_json(data):
    def bad(c):
        raise ValueError("non-finite constant " + c)
    json.loads(data, parse_constant=bad)


def resolve(x, d):
    return x.replace("{D}", d) if isinstance(x, str) else x


def run_case(case, exe, d, timeout, mem_mb):
    os.makedirs(d, exist_ok=True)
    for sub in case.dirs:
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    for name, data in case.files.items():
        if isinstance(data, Spliced):
            data.write(os.path.join(d, name))
            continue
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    argv = [exe] + [resolve(a, d) for a in case.argv]
    script = ("ulimit -v %d 2>/dev/null; " % (mem_mb * 1024) if mem_mb else "") + 'exec "$@"'
    if case.stdout_full:
        script += " >/dev/full"
    full = ["/bin/sh", "-c", script, "sh"] + argv
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.time()
    p = subprocess.Popen(full, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         env=env, start_new_session=True)
    hung = False
    try:
        out, err = p.communicate(timeout=timeout * case.timeout_scale)
    except subprocess.TimeoutExpired:
        hung = True
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the case's own process group (start_new_session)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    if "/dev/full" in argv:
        # eval --plot F writes F.gp and --csv F writes F-sensitivity.csv beside F: as root, regular files
        # in /dev; remove them (a regular file only, never the device)
        for side in ("/dev/full.gp", "/dev/full-sensitivity", "/dev/full-sensitivity.csv"):
            if os.path.isfile(side) and not os.path.islink(side):
                os.remove(side)
    return {"rc": p.returncode, "out": out, "err": err, "hung": hung, "secs": time.time() - t0, "argv": argv}


def classify(case, r, d, ctx=None):
    """(class, rule/reason). `ctx` (the Base) runs the unmutated input of a `same` case and the
    profile property's allocate; without it those two checks are skipped."""
    rc, out, err = r["rc"], r["out"], r["err"]
    if r["hung"]:
        return "hang", "no exit within the timeout"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "signal %d" % -rc
        return "crash", name
    m = CRASH_RE.search(err)
    if m:
        return "crash", "stderr: " + m.group(0).decode(errors="replace")
    if rc not in (0, 1):
        return "crash", "exit code %d" % rc
    if rc == 1:
        msg = err.decode(errors="replace")
        mm = re.search(r"depthkv: error: (\S.*)", msg)
        if not mm:
            return "wrong", "W6 no-message: exit 1 without 'depthkv: error: <message>'"
        argv = [resolve(a, d) for a in case.argv]
        text = msg[mm.start():]
        short = {"--model": "-m", "--prompt": "-p", "--tokenizer": "-z", "--temperature": "-t", "--steps": "-n",
                 "--output": "-o"}
        on_line = [f for f in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text) if f in argv or short.get(f) in argv]
        for flag in FLAG_COLON_RE.findall(text):
            if flag not in argv and short.get(flag) not in argv and not on_line:
                return "wrong", "W7 misleading: the message blames %s, not on the command line" % flag
        given = [resolve(p, d) for p in case.paths_in_msg]
        for p in given:
            if p and p not in text and os.path.basename(p.rstrip("/")) not in text:
                return "wrong", "W7 misleading: the message does not name the path given (%s)" % os.path.basename(p)
            if p:
                for q in QUOTED_PATH_RE.findall(text):
                    if q not in argv and not any(q in a for a in argv) and not p.startswith(q):
                        return "wrong", "W7 misleading: the message names '%s', a path never given" % q
        if case.valid and case.expect == "same" and ctx is not None and not case.control:
            want = expected_output(case, ctx)
            if want[0] is None and want[2] is not None:
                if normalize(mm.group(1).encode(errors="surrogateescape"), d) == want[2]:
                    return "clean", ""  # refused as the unmutated input is, for the command's options
                return "wrong-answer", "W8 answer: refused otherwise than the unmutated input (%s)" % want[1][:120]
        if case.valid:
            return "refused-valid", "R valid input refused: " + mm.group(1)[:200]
        if case.must_refuse and case.refuse_names and not any(
                n.lower() in text.lower() or n.lower().replace("_", " ") in text.lower() for n in case.refuse_names):
            return "wrong", "W10 unnamed: the message names none of %s (%s)" % (
                ", ".join(case.refuse_names), case.must_refuse)
        return "clean", ""
    # exit 0
    if case.must_refuse:
        return "wrong", "W1 accepted: " + case.must_refuse
    sub = case.argv[0]
    rx = NONFINITE_CS_RE if sub == "generate" else NONFINITE_RE
    m = rx.search(out)
    if m:
        return "wrong", "W2 non-finite: stdout holds '%s'" % m.group(0).decode(errors="replace")
    for o in case.outputs + [a for a in case.argv if isinstance(a, str) and a.startswith("{D}/") and
                              a.endswith((".csv", ".json")) and a not in case.outputs and a[4:] not in case.files]:
        path = resolve(o, d)
        if os.path.isfile(path):
            data = open(path, "rb").read()
            m = NONFINITE_RE.search(data)
            if m:
                return "wrong", "W2 non-finite: %s holds '%s'" % (os.path.basename(path), m.group(0).decode())
            if o in case.json_outputs:
                try:
                    strict_json(data)
                except ValueError as e:
                    return "wrong", "W4 json: %s is not strict JSON (%s)" % (os.path.basename(path), str(e)[:60])
    greedy = any(f in case.argv and case.argv[case.argv.index(f) + 1] == "0" for f in ("-t", "--temperature"))
    if sub == "generate" and greedy and b"<unk>" in out:
        return "wrong", "W3 unk: greedy decoding printed <unk>"
    if "--json" in case.argv:
        try:
            strict_json(out)
        except ValueError as e:
            return "wrong", "W4 json: stdout is not strict JSON (%s)" % str(e)[:60]
    if case.expect_stdout and not out.strip():
        return "wrong", "W5 empty: exit 0 with nothing on stdout"
    if case.expect == "same" and ctx is not None:
        want = expected_output(case, ctx)
        want_out, want_files = want[0], want[1]
        if want_out is None and len(want) > 2 and want[2] is not None:
            return "wrong-answer", "W8 answer: exit 0 where the unmutated input is refused (%s)" % want_files[:120]
        if want_out is None:
            return "refused-valid", "R " + want_files
        got = normalize(out, d)
        if got != want_out:
            return "wrong-answer", "W8 answer: stdout differs from the unmutated input's (%s)" % first_difference(
                got, want_out)
        got_files = case_outputs(case, d)
        for name, want in want_files.items():
            if got_files.get(name) != want:
                return "wrong-answer", "W8 answer: %s differs from the unmutated input's" % name
    why = check_property(case, r, d, ctx)
    if why:
        return "wrong-answer", "W9 property (%s): %s" % (property_of(case), why)
    return "success", ""


def save_repro(case, r, d, dest, cls, why, mem_mb, seed):
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.move(d, dest)
    for name, data in case.files.items():  # a model-sized file: --replay writes it again
        if isinstance(data, Spliced) and os.path.isfile(os.path.join(dest, name)):
            os.remove(os.path.join(dest, name))
    argv = [a.replace(d, dest) if isinstance(a, str) else a for a in r["argv"]]
    cmd = " ".join(shlex.quote(a) for a in argv) + (" >/dev/full" if case.stdout_full else "")
    replay = "python3 fuzz/corrupt_sweep.py --seed %d --replay %s:%s%d" % (seed, case.kind, "c" if case.control else "",
                                                                         case.index)
    with open(os.path.join(dest, "cmd.sh"), "w", errors="surrogateescape") as f:
        f.write("#!/bin/sh\n# %s %s-%s%d: %s; %s\n# (model-sized inputs are not kept: %s)\n%s%s\n" % (
            cls, case.kind, "c" if case.control else "", case.index, case.label, why, replay,
            "ulimit -v %d\n" % (mem_mb * 1024) if mem_mb else "", cmd))
    open(os.path.join(dest, "stdout"), "wb").write(r["out"][:1 << 20])
    open(os.path.join(dest, "stderr"), "wb").write(r["err"][:1 << 20])
    info = {"kind": case.kind, "index": case.index, "control": case.control, "label": case.label, "class": cls,
            "why": why, "expect": case.expectation(), "must_refuse": case.must_refuse, "rc": r["rc"],
            "secs": round(r["secs"], 3), "cmd": cmd, "replay": replay}
    with open(os.path.join(dest, "case.json"), "w", errors="surrogateescape") as f:
        json.dump(info, f, indent=1)
    return cmd


def fake_run(out=b"", err=b"", rc=0):
    return {"rc": rc, "out": out, "err": err, "hung": False, "secs": 0.0, "argv": []}


def self_test():
    """The classifier on runs with known verdicts: a wrong answer, a refused valid input, an unnamed
    refusal, a broken property must each be reported (no check here can pass by construction)."""
    class Ctx:
        lock = threading.Lock()
        expected = {}
        expected_locks = {}
    ctx = Ctx()
    d = "/nonexistent-case-folder"
    fails = []

    def expect(case, r, want, note):
        got = classify(case, r, d, ctx)
        if got[0] != want:
            fails.append("%s: got %s (%s), want %s" % (note, got[0], got[1], want))
        else:
            print("self-test ok: %-14s %s" % (want, note))

    # a `same` case whose stdout differs from the unmutated input's: wrong-answer (W8)
    c = Case("profile", 0, "self/same")
    c.argv = ["allocate", "--profile", "{D}/p.json", "--keep", "0.5", "--json"]
    c.same({"p.json": b"{}"})
    good = json.dumps({"budgets": [32, 32, 32, 32, 32], "total": 160, "length": 64, "keep": 0.5}).encode()
    ctx.expected[expected_key(c)] = (good, {})
    expect(c, fake_run(good), "success", "same stdout as the unmutated input")
    expect(c, fake_run(good.replace(b"[32, 32, 32, 32, 32]", b"[28, 36, 32, 32, 32]")), "wrong-answer",
           "same case, other budgets (W8)")
    # the unmutated input itself refused: the neutral case is refused-valid
    c2 = Case("profile", 1, "self/same-base-refused")
    c2.argv = c.argv + ["--policy", "optimal"]
    c2.same({"p.json": b"{}"})
    ctx.expected[expected_key(c2)] = (None, "the unmutated input's run exited 1")
    expect(c2, fake_run(good), "refused-valid", "unmutated input refused")
    # a neutral case refused: refused-valid
    expect(c, fake_run(err=b"depthkv: error: profile: bad\n", rc=1), "refused-valid", "neutral case refused")
    # property: budgets that do not sum to the total, a total off the keep ratio, a budget over the length
    p = Case("profile", 2, "self/property")
    p.argv = ["allocate", "--profile", "{D}/p.json", "--keep", "0.5", "--json"]
    expect(p, fake_run(good), "success", "allocate property holds")
    for bad, note in [({"budgets": [32, 32, 32, 32, 31], "total": 160}, "budgets off the total"),
                      ({"budgets": [32, 32, 32, 32, 33], "total": 161}, "total off the keep ratio"),
                      ({"budgets": [65, 32, 32, 16, 15], "total": 160}, "a budget over the length"),
                      ({"budgets": [100, 20, 20, 10, 10], "total": 160}, "a budget below the protected floor")]:
        bad.update({"length": 64, "keep": 0.5})
        expect(p, fake_run(json.dumps(bad).encode()), "wrong-answer", "allocate: " + note + " (W9)")
    t = Case("profile", 3, "self/text")
    t.argv = ["allocate", "--profile", "{D}/p.json", "--keep", "0.5"]
    table = (b"policy optimal, scorer h2o, keep 0.500 of 64 tokens x 2 layers = 64 tokens\nlayer  budget  keep ratio\n"
             b"    0      28       0.438\n    1      36       0.562\n")
    expect(t, fake_run(table), "success", "allocate table")
    expect(t, fake_run(table.replace(b"36  ", b"37  ")), "wrong-answer", "allocate table off its total (W9)")
    e = Case("tokens", 4, "self/eval")
    e.argv = ["eval", "--json"]
    row = {"budgets": [32, 32], "keep": 0.5, "kl": 0.01, "top1": 1.0, "bytes_kept": 1.0, "bytes_full": 2.0,
           "policy": "uniform", "scorer": "h2o"}
    expect(e, fake_run(json.dumps([row]).encode()), "success", "eval property holds")
    expect(e, fake_run(json.dumps([dict(row, kl=-0.5)]).encode()), "wrong-answer", "eval negative KL (W9)")
    expect(e, fake_run(json.dumps([row, dict(row, budgets=[40, 32])]).encode()), "wrong-answer",
           "eval policies of one keep spending different totals (W9)")
    pp = Case("tokens", 5, "self/perplexity")
    pp.argv = ["perplexity", "--json"]
    j = {"nll": 1.0, "ppl": math.e, "window_nll": [0.5, 1.5], "windows": 2}
    expect(pp, fake_run(json.dumps(j).encode()), "success", "perplexity property holds")
    expect(pp, fake_run(json.dumps(dict(j, ppl=3.0)).encode()), "wrong-answer", "perplexity ppl != exp(nll) (W9)")
    tk = Case("text", 6, "self/tokenize")
    tk.argv = ["tokenize", "-m", "x"]
    tk.n_vocab = 512
    expect(tk, fake_run(b"1 403 407\n"), "success", "tokenize ids in the vocabulary")
    expect(tk, fake_run(b"1 403 512\n"), "wrong-answer", "tokenize id outside the vocabulary (W9)")
    # refusals: a must-refuse case whose message names the key is clean; one that names nothing is W10
    r = Case("profile", 7, "self/refuse")
    r.argv = ["allocate", "--profile", "{D}/p.json"]
    r.refuse("missing required key n_layers", names=["n_layers"])
    expect(r, fake_run(err=b"depthkv: error: profile file 'p.json': missing key 'n_layers'\n", rc=1), "clean",
           "refusal naming the key")
    expect(r, fake_run(err=b"depthkv: error: profile file 'p.json' is bad\n", rc=1), "wrong",
           "refusal naming nothing (W10)")
    expect(r, fake_run(good), "wrong", "must-refuse input accepted (W1)")
    v = Case("tokens", 8, "self/control")
    v.argv = ["perplexity", "--json"]
    v.valid = True
    expect(v, fake_run(err=b"depthkv: error: no\n", rc=1), "refused-valid", "control refused")
    if fails:
        print("\n".join("self-test FAILED: " + f for f in fails))
        sys.exit(1)
    print("self-test: every verdict as expected")


# The python kind: fuzz/python_sweep.py's seeded cases (its valid controls are among them), run by
# the interpreter that has the package installed; its classes and expectations in this table's terms.
PY_CLASS = {"clean": "clean", "success": "success", "crash": "crash", "hang": "hang", "build-error": "crash",
            "wrong": "wrong-answer", "partial": "wrong-answer", "refused-valid": "refused-valid"}
PY_EXPECT = {"refuse": "refuse", "valid": "property", "either": "any"}


def default_python():
    venv = os.environ.get("DEPTHKV_VENV", "/tmp/depthkv-venv")
    py = os.path.join(venv, "bin", "python")
    return py if os.access(py, os.X_OK) else sys.executable


def python_kind(python, seed, n, jobs, timeout, out):
    """Runs n cases of python_sweep.py; returns (class counts, expectation counts, records, seconds)."""
    res = os.path.join(out, "python_sweep.json")
    t0 = time.time()
    r = subprocess.run([python, os.path.join(REPO, "fuzz", "python_sweep.py"), "--seed", str(seed), "--cases", str(n),
                        "--jobs", str(jobs), "--timeout", str(max(timeout, 60.0)), "--json", res, "--quiet"],
                       capture_output=True, text=True)
    if not os.path.isfile(res):
        sys.exit("corrupt_sweep: python_sweep.py (%s) wrote no results (exit %d): %s" % (python, r.returncode,
                                                                                        r.stderr[-2000:]))
    with open(res) as f:
        results = json.load(f)["results"]
    counts, expects, records = dict.fromkeys(CLASSES, 0), dict.fromkeys(EXPECTS, 0), []
    for x in results:
        cls = PY_CLASS.get(x["cls"], "crash")
        counts[cls] += 1
        expects[PY_EXPECT.get(x.get("expect"), "any")] += 1
        records.append(["python", str(x["index"]), "%s/%s" % (x.get("entry"), x.get("mutation")),
                        PY_EXPECT.get(x.get("expect"), "any"), cls, None, round(x.get("ms", 0) / 1000.0, 2),
                        str(x.get("why", ""))[:160]])
    return counts, expects, records, time.time() - t0


def git_info():
    def git(*a):
        try:
            return subprocess.run(["git", "-C", REPO] + list(a), capture_output=True, text=True, timeout=30).stdout
        except OSError:
            return ""
    return git("rev-parse", "HEAD").strip(), bool(git("status", "--porcelain", "--untracked-files=no").strip())


def file_id(path):
    st = os.stat(path)
    return (st.st_size, st.st_mtime_ns)


def parse_job(s):
    """'KIND:INDEX' or 'KIND:cINDEX' (a control) -> (kind, index, control)."""
    k, i = s.split(":")
    return k, int(i.lstrip("c")), i.startswith("c")


def table(kinds, counts, n_controls, total_label="all"):
    cols = ["clean", "success", "crash", "hang", "wrong", "wrong-answer", "refused-valid"]
    lines = ["| kind | cases | controls | clean error | success | crash | hang | wrong output | wrong answer | "
             "valid refused |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    tot = dict.fromkeys(cols, 0)
    tn = tc = 0
    for k in kinds:
        c = counts[k]
        runs = sum(c[x] for x in cols)
        lines.append("| %s | %d | %d | %s |" % (k, runs - n_controls[k], n_controls[k], " | ".join(str(c[x]) for x in cols)))
        for x in cols:
            tot[x] += c[x]
        tn += runs - n_controls[k]
        tc += n_controls[k]
    lines.append("| %s | %d | %d | %s |" % (total_label, tn, tc, " | ".join(str(tot[x]) for x in cols)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("DEPTHKV_BIN", os.path.join(REPO, "build", "release", "tools",
                                                                                 "depthkv")))
    ap.add_argument("--data", default=os.environ.get("DEPTHKV_DATA_DIR", os.path.join(os.path.dirname(REPO),
                                                                                       "shared")))
    ap.add_argument("--out", default=None, help="output folder (default /tmp/depthkv-sweep-SEED)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kind", default=",".join(KINDS))
    ap.add_argument("--cases", type=int, default=None,
                    help="cases per kind (default 1000; realgguf %d)" % DEFAULT_CASES["realgguf"])
    ap.add_argument("--quick", action="store_true", help="150 cases per kind")
    ap.add_argument("--controls", type=int, default=None, help="control cases per kind (default 12; realgguf 8)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=15.0, help="seconds per run before it counts as a hang")
    ap.add_argument("--mem-mb", type=int, default=4096, help="address-space limit per run (0: none)")
    ap.add_argument("--json", default=None, help="also write the table, the findings and every case's verdict "
                                                 "(with the commit) to this JSON file")
    ap.add_argument("--md", default=None, help="also write the table and the findings as markdown to this file")
    ap.add_argument("--replay", default=None, help="KIND:INDEX (KIND:cINDEX: a control): run one case, keep its "
                                                   "folder, print the verdict")
    ap.add_argument("--self-test", action="store_true", help="check the classifier on runs of known verdicts")
    ap.add_argument("--python", default=default_python(),
                    help="the interpreter with the depthkv package installed, for the python kind "
                         "(default $DEPTHKV_VENV/bin/python, /tmp/depthkv-venv, else this one)")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    exe = os.path.abspath(a.bin)
    if not os.access(exe, os.X_OK):
        sys.exit("corrupt_sweep: no program at %s (--bin)" % exe)
    out = os.path.abspath(a.out or "/tmp/depthkv-sweep-%d" % a.seed)
    if os.path.commonpath([out, REPO]) == REPO:
        sys.exit("corrupt_sweep: --out must lie outside the repository")
    kinds = [k for k in a.kind.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            sys.exit("corrupt_sweep: unknown kind %s (%s)" % (k, ", ".join(KINDS)))
    ncases = {k: 150 if a.quick else a.cases if a.cases is not None else DEFAULT_CASES.get(k, 1000) for k in kinds}
    nctl = {k: 0 if k == "python" else a.controls if a.controls is not None else N_CONTROLS.get(k, 12) for k in kinds}
    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    base = Base(os.path.abspath(a.data), out, exe)
    base.work = work
    base.args = (exe, a.timeout, a.mem_mb)
    base.need_real([parse_job(a.replay)[0]] if a.replay else kinds)

    if a.replay:
        k, i, control = parse_job(a.replay)
        case = make_case(base, a.seed, k, i, control)
        d = os.path.join(out, "replay", "%s-%s%d" % (k, "c" if control else "", i))
        if os.path.exists(d):
            shutil.rmtree(d)
        r = run_case(case, exe, d, a.timeout, a.mem_mb)
        cls, why = classify(case, r, d, base)
        print("%s %s [%s] expect %s rc=%s %.2fs: %s %s" % (cls, a.replay, case.label, case.expectation(), r["rc"],
                                                           r["secs"], why, "(must refuse: %s)" % case.must_refuse
                                                           if case.must_refuse else ""))
        print(" ".join(shlex.quote(x) for x in r["argv"]) + (" >/dev/full" if case.stdout_full else ""))
        print(r["err"].decode(errors="replace")[-2000:])
        print("files in", d)
        return

    commit, dirty = git_info()
    exe_id = file_id(exe)
    counts = {k: dict.fromkeys(CLASSES, 0) for k in kinds}
    expects = {k: dict.fromkeys(EXPECTS, 0) for k in kinds}
    findings = {}  # (kind, class, label, why) -> [count, first repro]
    records = []
    lock = threading.Lock()
    t_start = time.time()
    kind_secs = dict.fromkeys(kinds, 0.0)
    done = [0]
    cli_kinds = [k for k in kinds if k != "python"]
    jobs = [(k, i, True) for k in cli_kinds for i in range(nctl[k])] + [(k, i, False) for k in cli_kinds
                                                                         for i in range(ncases[k])]
    total = len(jobs)

    def one(job):
        k, i, control = job
        t0 = time.time()
        case = make_case(base, a.seed, k, i, control)
        name = "%s-%s%d" % (k, "c" if control else "", i)
        d = os.path.join(work, name)
        if os.path.exists(d):
            shutil.rmtree(d)
        r = run_case(case, exe, d, a.timeout, a.mem_mb)
        cls, why = classify(case, r, d, base)
        repro = None
        if cls in ("clean", "success"):
            shutil.rmtree(d, ignore_errors=True)
        else:
            dest = os.path.join(out, "repro", cls, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            save_repro(case, r, d, dest, cls, why, a.mem_mb, a.seed)
            repro = dest
        with lock:
            counts[k][cls] += 1
            expects[k][case.expectation()] += 1
            kind_secs[k] += time.time() - t0
            records.append([k, ("c%d" if control else "%d") % i, case.label, case.expectation(), cls, r["rc"],
                            round(r["secs"], 2), why[:160]])
            if repro:
                key = (k, cls, case.label, re.sub(r"\d{3,}", "N", why))
                f = findings.setdefault(key, [0, repro])
                f[0] += 1
            done[0] += 1
            if done[0] % 200 == 0:
                print("corrupt_sweep: %d/%d runs, %.0f s" % (done[0], total, time.time() - t_start), file=sys.stderr,
                      flush=True)

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        list(ex.map(one, jobs))
    if "python" in kinds:
        counts["python"], expects["python"], py_records, py_secs = python_kind(a.python, a.seed, ncases["python"],
                                                                             a.jobs, a.timeout, out)
        records += py_records
        kind_secs["python"] = py_secs * max(1, a.jobs)
    shutil.rmtree(work, ignore_errors=True)
    secs = time.time() - t_start
    changed = file_id(exe) != exe_id
    if changed:
        print("corrupt_sweep: WARNING: %s changed during the sweep: rerun" % exe, file=sys.stderr)

    head = "corrupt_sweep: %s, commit %s%s, seed %d, %s cases per kind + %s controls, %d jobs, timeout %g s, %.0f s" % (
        os.path.relpath(exe, REPO) if exe.startswith(REPO) else exe, commit[:12], " (dirty tree)" if dirty else "",
        a.seed, "/".join(str(ncases[k]) for k in kinds), "/".join(str(nctl[k]) for k in kinds), a.jobs, a.timeout, secs)
    tab = table(kinds, counts, nctl)
    print(head)
    print(tab)
    exp_lines = ["| kind | same | refuse | property | any | seconds |", "|---|---:|---:|---:|---:|---:|"]
    for k in kinds:
        exp_lines.append("| %s | %s | %.0f |" % (k, " | ".join(str(expects[k][x]) for x in EXPECTS),
                                                  kind_secs[k] / max(1, a.jobs)))
    print("\nexpected outcome per case (controls: same) and time per kind (busy seconds / jobs):")
    print("\n".join(exp_lines))
    find_lines = []
    if findings:
        print("\nnon-clean runs by kind, class, mutation and reason (count, first reproducer):")
        for (k, cls, label, why), (cnt, repro) in sorted(findings.items()):
            find_lines.append("  %-13s %4d  %-40s %s\n                     %s" % (cls, cnt, label, why,
                                                                               os.path.join(repro, "cmd.sh")))
        print("\n".join(find_lines))
    print("\nreproducers under %s" % os.path.join(out, "repro"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"program": os.path.relpath(exe, REPO) if exe.startswith(REPO) else exe, "commit": commit,
                       "dirty": dirty, "binary_changed": changed, "seed": a.seed, "cases_per_kind": ncases,
                       "controls_per_kind": nctl, "jobs": a.jobs, "timeout_s": a.timeout, "seconds": round(secs, 1),
                       "kind_seconds": {k: round(v / max(1, a.jobs), 1) for k, v in kind_secs.items()},
                       "counts": counts, "expects": expects,
                       "findings": [{"kind": k, "class": cls, "label": label, "why": why, "count": cnt,
                                     "repro": repro} for (k, cls, label, why), (cnt, repro) in sorted(findings.items())],
                       "case_columns": ["kind", "index (cN: control N)", "label", "expect", "class", "rc", "secs",
                                        "why"],
                       "cases": sorted(records, key=lambda x: (kinds.index(x[0]), x[1].startswith("c") is False,
                                                               int(x[1].lstrip("c"))))},
                      f, indent=None, separators=(",", ":"))
            f.write("\n")
    if a.md:
        with open(a.md, "w") as f:
            f.write("# Corruption sweep (fuzz/corrupt_sweep.py)\n\n%s\n\n%s\n\n"
                    "Expected outcome per case and time per kind (busy seconds / jobs):\n\n%s\n" % (
                        head.replace("corrupt_sweep: ", "Run: "), tab, "\n".join(exp_lines)))
            if find_lines:
                f.write("\nNon-clean runs (count, first reproducer):\n\n```\n%s\n```\n" % "\n".join(find_lines))
            if changed:
                f.write("\n**The program changed during the sweep: rerun.**\n")


if __name__ == "__main__":
    main()

"""RULER-style synthetic long-context tasks (Hsieh et al., 2024, "RULER: What's the Real Context
Size of Your Long-Context Language Models?"), generated from templates with no download, sized
to a target length in one model's own tokens.

Every sample is a dict: ``task``, ``seed``, ``context`` (the text to compress), ``question`` (what
follows the context: the question and the answer prefix), ``answers`` (the reference strings) and
``n_context`` / ``n_question`` (tokens under the tokenizer it was sized with). Samples of one
(task, length, seed) are the same on every run. Scored by :func:`string_match_all`.

Tasks (RULER's names):
- ``niah_single_1``: one 7-digit needle in the noise haystack (RULER's repeated "The grass is
  green. ..." sentences);
- ``niah_single_2``: one 7-digit needle in real prose (text files of this Debian machine);
- ``niah_multikey_1``: one needle among 3 distractor needles of other keys, noise haystack;
- ``niah_multivalue``: 4 values of one key, all asked;
- ``niah_multiquery``: 4 keys, each with a value, all asked;
- ``vt``: variable tracking, one chain of 4 hops (``VAR A = 12345``, ``VAR B = VAR A``, ...) in
  noise; the answer is every variable of the chain;
- ``cwe``: common-words extraction: a numbered list of words in which 10 words appear many times
  and the others a few; the answer is the 10 common words.
"""

from __future__ import annotations

import glob
import os
import random
import re
from typing import Callable, Dict, List, Sequence

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

#: Keys of the needles and the words of cwe: common English nouns (one token or a few each).
WORDS = """apple anchor arrow autumn badge bakery balloon banana basket beacon blanket bottle bridge
bucket butter cabin cactus camera candle canyon carpet castle cattle cellar chapel cherry circus
cliff clock cloud comet copper cotton crater crayon desert diamond dragon drum eagle engine falcon
feather fender fiddle forest fossil fountain garden garlic ginger glacier goblet granite guitar
hammer harbor harvest helmet hollow honey island jacket jungle kettle ladder lantern lemon lizard
magnet mango marble meadow mirror monkey mountain needle nickel oasis orbit orchard oyster paddle
palace panther parrot pepper pillow planet pocket potato prairie puzzle quarry rabbit radish
raven ribbon river rocket saddle salmon satchel shadow shelter silver sparrow spider spruce
stable statue summit temple thunder ticket timber tomato tower trumpet tunnel turtle valley
velvet violin wagon walnut willow window winter wizard yogurt zebra""".split()

#: Where niah_single_2 takes its prose: English text files every Debian machine has.
PROSE_GLOBS = ("/usr/share/common-licenses/*",)

TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multivalue", "niah_multiquery", "vt", "cwe")

#: Seeds of calibration samples (choices may be made on them) and of reported ones: disjoint.
CALIBRATION_SEEDS = range(0, 1000)
REPORT_SEEDS = range(1000, 2000)


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """RULER's metric: the fraction of reference strings found in the prediction (case-insensitive)."""
    p = prediction.lower()
    return sum(a.lower() in p for a in answers) / len(answers)


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _prose_sentences() -> List[str]:
    files = sorted(f for g in PROSE_GLOBS for f in glob.glob(g) if os.path.isfile(f))
    text = " ".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    text = re.sub(r"\s+", " ", text)
    return [s.strip() + "." for s in re.split(r"(?<=[a-z])\.\s+", text) if 40 <= len(s) <= 400]


def _fill(units: Callable[[int], List[str]], insert: Callable[[List[str]], List[str]], fixed: str,
          count: Callable[[str], int], target: int) -> str:
    """The context of about `target` tokens (never more): the largest n for which the n haystack
    units `units(n)`, with the needles inserted (`insert`), joined by spaces, plus `fixed` (the
    question) count at most `target` tokens."""
    def build(n: int) -> str:
        return " ".join(insert(units(n)))

    if count(build(1) + fixed) > target:
        raise ValueError(f"a length of {target} tokens holds not even one haystack unit with the needles and the "
                         "question: ask for a longer one")
    lo, hi = 1, 1
    while count(build(hi) + fixed) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(build(mid) + fixed) <= target:
            lo = mid
        else:
            hi = mid
    return build(lo)


def _at_depths(needles: Sequence[str], rng: random.Random) -> Callable[[List[str]], List[str]]:
    """Inserts each needle at a seeded depth (a fraction of the haystack, uniform in [0, 1])."""
    depths = [rng.random() for _ in needles]

    def insert(units: List[str]) -> List[str]:
        out = list(units)
        for d, s in sorted(zip(depths, needles), reverse=True):
            out.insert(round(d * len(units)), s)
        return out
    return insert


def make_sample(task: str, length: int, seed: int, count: Callable[[str], int]) -> Dict:
    """One sample of `task` whose context and question count at most `length` tokens under `count`
    (a function of text giving its token count, e.g. ``lambda t: len(engine.tokenize(t))``)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: one of {', '.join(TASKS)}")
    rng = random.Random(f"{task}:{length}:{seed}")
    keys = rng.sample(WORDS, 4)
    noise = lambda n: [NOISE] * n  # noqa: E731
    if task == "niah_single_2":
        prose = _prose_sentences()
        start = rng.randrange(len(prose) // 2)
        noise = lambda n: [prose[(start + i) % len(prose)] for i in range(n)]  # noqa: E731
    prefix = "Some special magic numbers are hidden within the following text. Make sure to memorize them. " \
             "I will quiz you about the numbers afterwards.\n"
    if task in ("niah_single_1", "niah_single_2", "niah_multikey_1"):
        values = [_number(rng) for _ in keys]
        needles = [_needle(k, v) for k, v in zip(keys, values)][: 1 if task != "niah_multikey_1" else 4]
        q = (f"\nWhat is the special magic number for {keys[0]} mentioned in the provided text? "
             f"The special magic number for {keys[0]} mentioned in the provided text is")
        answers = [values[0]]
    elif task == "niah_multivalue":
        values = [_number(rng) for _ in range(4)]
        needles = [_needle(keys[0], v) for v in values]
        q = (f"\nWhat are all the special magic numbers for {keys[0]} mentioned in the provided text? "
             f"The special magic numbers for {keys[0]} mentioned in the provided text are")
        answers = values
    elif task == "niah_multiquery":
        values = [_number(rng) for _ in keys]
        needles = [_needle(k, v) for k, v in zip(keys, values)]
        q = (f"\nWhat are all the special magic numbers for {', '.join(keys[:-1])} and {keys[-1]} mentioned in "
             f"the provided text? The special magic numbers for {', '.join(keys[:-1])} and {keys[-1]} mentioned "
             "in the provided text are")
        answers = values
    elif task == "vt":
        names = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(5)]
        value = str(rng.randint(10_000, 99_999))
        needles = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
        prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
        q = (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. "
             f"Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
             f"assigned the value {value}, they are:")
        answers = names
    else:  # cwe
        common = rng.sample(WORDS, 10)
        rare = [w for w in WORDS if w not in common]
        prefix = "Below is a numbered list of words. In these words, some appear more often than others. " \
                 "Memorize the ones that appear most often.\n"
        q = ("\nQuestion: What are the 10 most common words in the above list? "
             "Answer: The top 10 words that appear most often in the list are:")

        def words(n: int) -> List[str]:
            r = random.Random(f"cwe:{seed}:{n}")
            ws = [w for w in common for _ in range(max(3, n // 2))] + [r.choice(rare) for _ in range(3 * n)]
            r.shuffle(ws)
            return [f"{i + 1}. {w}" for i, w in enumerate(ws)]
        context = prefix + _fill(words, lambda u: u, q, count, length - count(prefix))
        return _sample(task, seed, context, q, common, count)
    context = prefix + _fill(noise, _at_depths(needles, rng), q, count, length - count(prefix))
    return _sample(task, seed, context, q, answers, count)


def _sample(task: str, seed: int, context: str, question: str, answers: Sequence[str],
            count: Callable[[str], int]) -> Dict:
    return {"task": task, "seed": seed, "context": context, "question": question, "answers": list(answers),
            "n_context": count(context), "n_question": count(question)}

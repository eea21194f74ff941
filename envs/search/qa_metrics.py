"""Short-answer QA scoring: exact match and token F1 after SQuAD normalisation.

The normalisation and both metrics follow the SQuAD v1.1 evaluation script (Rajpurkar et al. 2016,
"SQuAD: 100,000+ Questions for Machine Comprehension of Text"), which Search-R1 and most open-domain
QA work use: lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace. With
several reference answers the best score over them counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: ``"The  Eiffel-Tower!" -> "eiffeltower"``."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised reference, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(r) for r in references))


def token_f1(prediction: str, references: Sequence[str]) -> float:
    """Best token-overlap F1 (in [0, 1]) of the normalised prediction against the references.

    For one reference: ``precision = common / len(pred_tokens)``, ``recall = common /
    len(ref_tokens)``, ``F1 = 2PR / (P + R)``, where ``common`` counts shared tokens with
    multiplicity; 0 when either side is empty (unless both are).
    """
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for ref in references:
        ref_tokens = normalize_answer(ref).split()
        if not pred_tokens or not ref_tokens:
            best = max(best, float(pred_tokens == ref_tokens))
            continue
        common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
        if common:
            p, r = common / len(pred_tokens), common / len(ref_tokens)
            best = max(best, 2 * p * r / (p + r))
    return best

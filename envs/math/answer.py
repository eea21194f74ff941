"""Final answers of math replies: where the answer is, its number in every common written form, and
whether it equals the gold.

Extraction (:func:`extract_answer`): the last ``<answer>…</answer>`` tag; else the last ``\\boxed{…}``;
else the last "answer is …" / "answer: …" phrase; else the last number in the text. Whatever the
source, the answer is then normalised the same way (:func:`normalise_answer`):

* wrappers: ``$…$``, ``\\(…\\)``, ``\\[…\\]``, ``\\boxed{…}``, ``\\fbox{…}``, ``\\text{…}`` /
  ``\\textbf{…}`` / ``\\mathrm{…}`` around the whole answer, a leading ``x =``, a trailing period;
* numbers: thousands separators (``9,500``, ``9{,}500``, ``9\\,500``, ``9\\ 500``, ``9~500``,
  thin spaces, and ``9 500`` where the whole answer is the number — a comma groups thousands only
  in groups of exactly three digits, so ``0,1`` stays a pair), a currency sign, a trailing unit
  (``\\text{ dollars}``, ``cm``, ``%``), the Unicode minus, ``\\frac`` / ``\\dfrac`` / ``\\tfrac``
  with integer parts (written ``a/b``, with one sign in front: ``3/-4`` is ``-3/4``, a ``+`` on
  either part is no sign, and a zero numerator is ``0``).

Equality with the gold (:func:`answers_equal`):

* a gold that is a plain number (an integer or a decimal) is compared exactly, as a fraction: the
  answer's value must be the same rational number. A fraction answer (``\\frac{7}{2}`` for 3.5)
  counts unless the question asks for a decimal form (it mentions decimals, rounding, significant
  digits or scientific notation). A LaTeX answer our rules do not read (``\\sqrt{16}``,
  ``7 \\div 2``) is read with ``math-verify``'s LaTeX parser and counts only when its value is an
  exact rational equal to the gold;
* any other gold (an expression, a set, an interval) is compared with ``math-verify``'s ``verify``
  (Hugging Face Math-Verify, https://github.com/huggingface/Math-Verify), but only where the question
  does not ask for a specific form (lowest terms, a fraction, a decimal...: then the task's own
  scorer decides), and with guards for the cases where ``verify`` is known to say "equal" wrongly
  (its issue tracker, huggingface/Math-Verify issues #14, #21, #41, #60): numbers closer than its
  float tolerance (``1/2^{99}`` vs ``1/2^{98}``, ``10^{-7}`` vs ``2·10^{-7}``, ``0.333333`` vs
  ``1/3``) — numeric values are compared exactly instead; ``±`` on one side only; equations
  (only one side was compared); times and ratios (``12:00`` vs ``1:00``) and sequences with an
  ellipsis; and LaTeX it does not read (``4\\sqrt(2)``: math-verify's expression mode reads ``4``; we use
  its LaTeX mode only, which reads nothing there).

``math-verify`` is used without its signal-based timeout (that works only on the main thread, and
envs score on their own threads); inputs that could make sympy work for long (long answers, big
exponents or factorials, nested powers) are not given to it.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
from fractions import Fraction
from typing import Any

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
# Up to the last closing tag: ".*" runs to the end and backs off to it, one pass.
_UP_TO_LAST_CLOSE = re.compile(r".*</answer>", re.S | re.I)
# One marker of that tag, opening or closing (group 1: the slash): what a text must not hold, or must
# hold escaped, for its own final tag to read as intended.
ANSWER_MARK = re.compile(r"<(/?)answer>", re.I)
_ANSWER_PHRASE = re.compile(r"\banswer\s*(?:is|:|=)\s*:?\s*(.+?)(?:\.(?:\s|$)|\n|$)", re.I | re.S)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LATEX_MATH = re.compile(r"\\[a-zA-Z]+|\^")
# A slash between digits ("0/5", "3 / -4"); a unit's slash ("12 km/h") has letters around it.
_DIGIT_SLASH = re.compile(r"\d\s*/\s*[-+]?\d")

# Separators that group thousands (each followed by exactly three digits).
_SEP = r"(?:,|\{,\}|\\,|\\ |~|\\;|\\!|\u2009|\u202f|\u00a0|\\thinspace\s*)"
_GROUPED = rf"\d{{1,3}}(?:{_SEP}\d{{3}})+"
_DECIMAL = rf"(?:{_GROUPED}|\d+)(?:\.\d+)?|\.\d+"
_FRAC = r"\\[dt]?frac\s*\{\s*[-+]?\d+\s*\}\s*\{\s*[-+]?\d+\s*\}"
# A number in running text (plain spaces never group digits here: "3 500-page books" is two numbers).
_NUMBER_IN_TEXT = re.compile(rf"[-\u2212]?(?:{_FRAC}|\d+\s*/\s*\d+(?![\d.])|{_DECIMAL})")

# Math delimiters around a whole answer: (opening, closing).
_WRAPPER_PAIRS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_TEXT_COMMANDS = r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)"
# Matched at a position (pattern.match(text, pos, endpos)), so without "^", which matches only at 0.
_COMMAND_OPENS = tuple(re.compile(rf"{c}\s*\{{") for c in (r"\\boxed", r"\\fbox", _TEXT_COMMANDS))
_LEADING_VARIABLE = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!.*=)", re.S)
_CURRENCY = re.compile(r"^(?:\\\$|\$|US\$|USD\s*|€|£|¥|\\euro\s*|\\pounds\s*)")
# "(?<!\s)": a match starts where its spaces start, as the leftmost match did without it; trying it
# inside a run of spaces too made sub() quadratic in the run (a reply of 20,000 spaces: 1.8 s).
_PERCENT = re.compile(r"(?<!\s)\s*(?:\\%|%|\\text\{\s*percent\s*\}|percent)$")
# A trailing unit: a \text{...} unit, or words after a space ("12 apples"; "0xabc" is not 12 + unit).
# The words' check looks only as far as unit characters go: a unit runs to the end in them, so where
# the match can succeed it sees what ".*" saw, and it no longer scans the rest of the answer at every
# digit (quadratic: "1 a" repeated 4,000 times took 0.6 s, "1", 20,000 spaces, "a1" 6 s).
_UNIT = re.compile(
    rf"^(?P<num>.*?\d[}}$)]*)(?:\s*{_TEXT_COMMANDS}\s*\{{\s*[A-Za-z][A-Za-z .\-/^0-9]*\}}|\s+(?=[A-Za-z])(?![A-Za-z .\-/]*\b(?:or|and|not|maybe|plus|minus|times)\b)[A-Za-z][A-Za-z .\-/]*)$",
    re.S,
)

# Questions that ask for a form: then a value in another form is not the answer.
_ASKS_DECIMAL = re.compile(r"\b(?:decimal|round|significant|scientific|\d+ places)", re.I)
_ASKS_FORM = re.compile(
    r"\b(?:decimal|round|significant|scientific|fraction|lowest terms|simplest|simplif|reduced|expand|"
    r"factor|exact form|format|hexa|binary|base \d)",
    re.I,
)


# A brace that counts: one right after a backslash is escaped (``\\{``, and also the ``{`` of ``\\\\{``).
_BRACE = re.compile(r"(?<!\\)[{}]")


def _closing_braces(text: str, start: int = 0) -> dict[int, int]:
    """``{open: close}``: the ``}`` closing each ``{`` from ``start`` on that closes.

    One pass with a stack. Scanning from each brace to its close instead was quadratic where braces
    nest or never close (a 350 KB reply of repeated ``\\boxed{`` took 406 s to score). Where a ``{``
    closes depends only on the text after it, so ``start`` may be any index before the braces asked about.
    """
    opened: list[int] = []
    closes: dict[int, int] = {}
    for m in _BRACE.finditer(text, start):
        if m.group() == "{":
            opened.append(m.start())
        elif opened:
            closes[opened.pop()] = m.start()
    return closes


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) with balanced braces, or None."""
    boxes = list(_BOXED.finditer(text))
    if not boxes:
        return None
    closes = _closing_braces(text, boxes[0].end() - 1)
    for m in reversed(boxes):
        end = closes.get(m.end() - 1)
        if end is not None:
            return text[m.end() : end]
    return None


def _strip_spaces(text: str, lo: int, hi: int) -> tuple[int, int]:
    """The bounds of ``text[lo:hi].strip()``, found without copying the text."""
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    return lo, hi


def unwrap(answer: str) -> str:
    """Strip what surrounds an answer without changing it: math delimiters, ``\\boxed``, ``\\text``,
    a leading ``x =``, a trailing period, surrounding spaces. Applied until nothing changes."""
    # Bounds into the answer, whose brace pairs are found once: copying and rescanning the rest for
    # each layer stripped was quadratic in the nesting (``\\text{\\text{…}}`` 50,000 deep: minutes).
    lo, hi = _strip_spaces(answer, 0, len(answer))
    closes: dict[int, int] | None = None
    while True:
        before = lo, hi
        lo, hi = _strip_spaces(answer, lo, hi)
        while hi > lo and answer[hi - 1] == ".":
            hi -= 1
        lo, hi = _strip_spaces(answer, lo, hi)
        for opening, closing in _WRAPPER_PAIRS:
            fits = hi - lo >= len(opening) + len(closing)
            if fits and answer.startswith(opening, lo, hi) and answer.endswith(closing, lo, hi):
                lo, hi = _strip_spaces(answer, lo + len(opening), hi - len(closing))
        for command_open in _COMMAND_OPENS:
            m = command_open.match(answer, lo, hi)
            if m:
                closes = _closing_braces(answer) if closes is None else closes
                if closes.get(m.end() - 1) == hi - 1:
                    lo, hi = _strip_spaces(answer, m.end(), hi - 1)
        m = _LEADING_VARIABLE.match(answer, lo, hi)
        if m:
            lo = m.end()
        if (lo, hi) == before:
            return answer[lo:hi]


def _number_text(s: str) -> str | None:
    """The plain text of the number ``s`` is (``-9500``, ``3.5``, ``7/2``), or None when ``s`` is not
    exactly one number (with optional wrappers, currency, unit, percent sign), or has more digits
    than Python converts to an int (``sys.get_int_max_str_digits()``: 4,300 by default)."""
    if _too_many_digits(s):  # int()/Fraction() would raise ValueError on it: no answer of ours
        return None
    s = unwrap(s.replace("\u2212", "-"))
    m = _UNIT.match(s)
    if m and _number_text(m.group("num")) is not None:
        s = m.group("num")
    s = unwrap(s)
    sign = ""
    if s[:1] in ("-", "+"):
        sign, s = ("-" if s[0] == "-" else ""), s[1:].strip()
    s = unwrap(_PERCENT.sub("", _CURRENCY.sub("", s)))
    if not sign and s[:1] == "-":  # "\\$-5": the sign after the currency sign
        sign, s = "-", s[1:].strip()
    if re.fullmatch(r"\d{1,3}(?: \d{3})+(?:\.\d+)?", s):
        s = s.replace(" ", "")
    if re.fullmatch(rf"{_GROUPED}(?:\.\d+)?", s):
        s = re.sub(_SEP, "", s)
    if re.fullmatch(r"\d+(?:\.\d+)?|\.\d+", s):
        # A zero carries no sign, as "0/-1" -> "0" below: "-0" and "-0.0" read as negative to a reader.
        return ("" if float(s) == 0 else sign) + s
    m = re.fullmatch(
        r"\\[dt]?frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*([-+]?\d+)\s*\}|([-+]?\d+)\s*/\s*([-+]?\d+)", s
    )
    if m:
        num, den = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        if int(den) != 0:
            if int(num) == 0:  # "0/-1" is 0: a "-0/1" would read as a negative answer to a reader
                return "0"
            # One sign in front: Fraction() reads "-3/4" but refuses "3/-4", "3/+4" and "-1/-2"
            # (ValueError); a "+" anywhere reads as no sign.
            negative = (sign == "-") ^ num.startswith("-") ^ den.startswith("-")
            return f"{'-' if negative else ''}{num.lstrip('-+')}/{den.lstrip('-+')}"
    return None


def _too_many_digits(s: str) -> bool:
    limit = sys.get_int_max_str_digits()
    return bool(limit) and sum(c.isdigit() for c in s) > limit


def normalise_answer(answer: str) -> str:
    """The answer with wrappers stripped and, where it is one number, that number's plain text
    (``"\\boxed{$9{,}500}"`` -> ``"9500"``, ``"\\dfrac{7}{2}"`` -> ``"7/2"``, ``"12 apples"`` -> ``"12"``);
    anything else unwrapped only (``"\\text{Friday}."`` -> ``"Friday"``)."""
    s = unwrap(answer)
    number = _number_text(s)
    return number if number is not None else s


def _answer_tags(text: str) -> list[str]:
    """``_ANSWER_TAG.findall(text)`` in linear time: searched only up to the last closing tag, since
    past it every opening tag's lazy ``.*?`` scans to the end and fails (quadratic in unclosed tags:
    50,000 ``<answer>`` without a close took minutes to score). No match can end after that close, so
    the matches are the same."""
    last_close = _UP_TO_LAST_CLOSE.match(text)
    return [] if last_close is None else _ANSWER_TAG.findall(text, 0, last_close.end())


def _final_span(text: str) -> tuple[str | None, bool]:
    """The final answer as written (before normalisation) and whether it was in ``<answer>`` tags."""
    tags = _answer_tags(text)
    if tags:
        return tags[-1], True
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, False
    phrases = _ANSWER_PHRASE.findall(text)
    # A phrase counts when it is a number or LaTeX; "answer: first compute 3+4=7. So 7." is prose,
    # and its last number is the answer.
    if phrases and (_number_text(phrases[-1]) is not None or _LATEX_MATH.search(phrases[-1])):
        return phrases[-1], False
    numbers = _NUMBER_IN_TEXT.findall(text)
    return (numbers[-1] if numbers else None), False


def written_answer(text: str) -> str | None:
    """The final answer :func:`extract_answer` finds, as written (stripped, not normalised)."""
    span, _ = _final_span(text)
    return None if span is None else span.strip()


def extract_answer(text: str) -> tuple[str | None, bool]:
    """The model's final answer, normalised, and whether it used ``<answer>`` tags.

    Returns ``(answer, tagged)``; ``answer`` is None when the reply holds no tag, no ``\\boxed{}``,
    no "answer is" phrase and no number.
    """
    span, tagged = _final_span(text)
    return (None if span is None else normalise_answer(span)), tagged


def plain_number(text: str) -> Fraction | None:
    """The value of an integer or decimal written plainly (separators and wrappers allowed), or None
    (a fraction, an expression, anything else)."""
    number = _number_text(unwrap(text))
    if number is None or "/" in number:
        return None
    return Fraction(number)


def answer_value(answer: str) -> Fraction | None:
    """The exact rational value of an answer: a number in any form :func:`normalise_answer` reads, or
    LaTeX that ``math-verify`` reads to an exact rational (``\\sqrt{16}``, ``7 \\div 2``); else None."""
    number = _number_text(unwrap(answer))
    if number is not None:
        return Fraction(number)
    latex = unwrap(answer)
    if not _LATEX_MATH.search(latex):  # words or malformed numbers: nothing for a LaTeX parser to read
        return None
    value = _math_verify_value(latex)
    if value is None or not value.is_Rational:
        return None
    return Fraction(int(value.p), int(value.q))


def answers_equal(answer: str | None, gold: str, question: str = "") -> bool:
    """Whether ``answer`` (as written by the model, or as :func:`extract_answer` returns it) is the gold.

    Args:
        answer: the model's final answer text (None: no answer, never equal).
        gold: the task's reference answer.
        question: the task's question, read for the form it asks for (see the module docstring).

    Returns:
        True only where the value is the same (numbers: exactly; other golds: ``math-verify`` with
        the guards in the module docstring) and the form is allowed.
    """
    if answer is None:
        return False
    expected = plain_number(gold)
    if expected is not None:
        value = answer_value(answer)
        if value is None or value != expected:
            return False
        written = normalise_answer(answer)
        # "0/5" normalises to "0" but was written as a fraction all the same.
        is_fraction = "/" in written or _DIGIT_SLASH.search(answer) or "\\frac" in answer or "\\div" in answer
        return not (is_fraction and _ASKS_DECIMAL.search(question))
    if _ASKS_FORM.search(question):
        return False
    return math_verify_equal(unwrap(answer), unwrap(gold))


# ---- math-verify, guarded ------------------------------------------------------------------------

_MAX_CHARS = 200
_RISKY = re.compile(r"\d{4,}\s*!|\^\s*\{?\s*-?\d{4,}|\^\s*\{[^{}]*\^|\\underbrace|\\overbrace")
_PARTIAL_COMPARE = re.compile(
    r"=|:|\\ldots|\\cdots|\\dots|\.\.\.|\u2026|\\approx|<|>|\\(?:le|ge|leq|geq|neq|ne)(?![a-zA-Z])"
)
_PLUS_MINUS = re.compile(r"\\pm|\\mp|\u00b1|\u2213")


class _NoTimeoutNotice(logging.Filter):
    """Drops math-verify's once-a-process notice that its timeout is off ("Timeout is disabled as
    parsing_timeout is None ..."), logged at the first call off the main thread: the timeout is off on
    purpose there (see the module docstring), and the notice, printed at whichever answer first
    reached math-verify in an env (``\\frac{1}{0}`` in a fresh-user walk), read as that answer's failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@functools.lru_cache(maxsize=1)
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - a declared dependency of the math extra
        raise ImportError("answer checking needs math-verify: pip install 'chatgym[math]'") from exc
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_NoTimeoutNotice())
    return math_verify


def _timeout() -> int | None:
    # math-verify's timeout uses signal.alarm, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse(latex: str) -> list[Any]:
    # Unbalanced braces are no LaTeX math, and garbage is where sympy's parser is slowest.
    if len(latex) > _MAX_CHARS or _RISKY.search(latex) or _closing_braces(f"{{{latex}}}").get(0) != len(latex) + 1:
        return []
    mv = _math_verify()
    latex = re.sub(r"\\[dt]frac", r"\\frac", latex)
    return mv.parse(f"${latex}$", extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=_timeout())


def _read_whole(latex: str) -> Any:
    """math-verify's sympy value of ``latex``, or None when it reads nothing (it then returns the
    text alone, as for ``4\\sqrt(2)``, or an empty list)."""
    try:
        parsed = _parse(latex)
    except Exception:  # math-verify raises on what sympy cannot take; that is "not read"
        return None
    if len(parsed) < 2 or isinstance(parsed[0], str):
        return None
    return parsed[0]


def _math_verify_value(latex: str) -> Any:
    import sympy

    value = _read_whole(latex)
    if not isinstance(value, sympy.Basic):
        return None
    try:
        value = value.doit()
    except Exception:
        return None
    return value if value.is_number else None


def _exactly_equal(a: Any, b: Any) -> bool:
    """Exact equality of two numeric sympy values: decimals are read as the exact rationals they
    write (``0.333333`` is 333333/10^6, not 1/3), and no tolerance is applied."""
    import sympy

    try:
        a, b = (x.doit() for x in (a, b))
        a, b = (x.xreplace({f: sympy.Rational(str(f)) for f in x.atoms(sympy.Float)}) for x in (a, b))
        if a.is_Rational and b.is_Rational:
            return bool(a == b)
        return bool(sympy.simplify(a - b) == 0)
    except Exception:
        return False


def math_verify_equal(answer: str, gold: str) -> bool:
    """``math-verify``'s ``verify(gold, answer)`` with the guards of the module docstring.

    Both sides are LaTeX without ``$`` (as :func:`unwrap` leaves them). Returns False whenever a
    guard applies, math-verify reads nothing, or it raises.
    """
    import sympy

    if _PARTIAL_COMPARE.search(answer) or _PARTIAL_COMPARE.search(gold):
        return answer.strip() == gold.strip()
    if bool(_PLUS_MINUS.search(answer)) != bool(_PLUS_MINUS.search(gold)):
        return False
    a, g = _read_whole(answer), _read_whole(gold)
    if a is None or g is None:
        return False
    # A comma that is not a thousands separator makes a tuple or a set: a single number on either
    # side is then a misreading ("0,1" read as 0.1).
    for text, value in ((answer, a), (gold, g)):
        if "," in re.sub(_GROUPED, "", text) and isinstance(value, sympy.Number):
            return False
    if isinstance(a, sympy.Basic) and isinstance(g, sympy.Basic) and a.is_number and g.is_number:
        return _exactly_equal(a, g)  # no float tolerance between numbers
    mv = _math_verify()
    try:
        return bool(mv.verify([g, gold], [a, answer], timeout_seconds=_timeout()))
    except Exception:
        return False

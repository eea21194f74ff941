"""WikiQA (built from the corpus) and FreshQA (from inspect-evals): sizes, determinism, splits, and
that every WikiQA answer is really supported by the corpus; plus the QA metrics."""

import re
from collections import Counter

import pytest

from chatgym.envs.search.freshqa import load_freshqa
from chatgym.envs.search.qa_metrics import exact_match, normalize_answer, token_f1
from chatgym.envs.search.wiki_qa import QA_TYPES, _all_questions, base_title, load_wiki_qa
from chatgym.retrievers.corpora import wiki_corpus

DOCS = {d.id: d for d in wiki_corpus()}


@pytest.fixture(scope="module")
def rows():
    return _all_questions()


def test_sizes_are_fixed(rows):
    assert Counter(r["type"] for r in rows) == {"describe": 8989, "define": 7588, "bridge": 2203}
    train, test = load_wiki_qa("train"), load_wiki_qa("test")
    assert len(train) + len(test) == len(rows) == 18_780
    assert len({r["task_id"] for r in rows}) == len(rows)


def test_examples_by_hand():
    by_id = {r["task_id"]: r for r in _all_questions()}
    r = by_id["wikiqa/describe/2001: A Space Odyssey"]
    assert r["question"] == 'What is "1968 film by Stanley Kubrick"?'
    assert (
        r["answers"] == ["2001: A Space Odyssey"]
        and r["support"] == ["2001: A Space Odyssey"]
        and r["hops"] == 1
    )
    # The first sentence: "2001: A Space Odyssey is a 1968 epic science fiction film produced and directed
    # by Stanley Kubrick, who co-wrote the screenplay with Arthur C. Clarke."  ("C." is an initial.)
    r = by_id["wikiqa/define/2001: A Space Odyssey"]
    assert r["question"] == (
        "What is a 1968 epic science fiction film produced and directed by Stanley Kubrick, "
        "who co-wrote the screenplay with Arthur C. Clarke?"
    )
    assert by_id["wikiqa/define/Dune (novel)"]["answers"] == ["Dune (novel)", "Dune"]
    # Achilles ("Greek mythological hero") names the Iliad, whose description is shared with the Odyssey.
    r = by_id["wikiqa/bridge/Achilles/Iliad"]
    assert (
        r["question"]
        == 'Which "Epic poem attributed to Homer" is mentioned in the article about "Greek mythological hero"?'
    )
    assert r["support"] == ["Achilles", "Iliad"] and r["hops"] == 2 and r["answers"] == ["Iliad"]
    # "Louvre Museum" in the Venus de Milo lead is part of a longer name: not a mention of "Louvre".
    assert "wikiqa/bridge/Venus de Milo/Louvre" not in by_id and "wikiqa/bridge/Venus de Milo/Greece" in by_id


def test_every_answer_is_supported_by_the_corpus(rows):
    descriptions = Counter(d.meta["description"] for d in DOCS.values())
    for r in rows:
        answer = r["answers"][0]
        assert answer == r["support"][-1] and answer in DOCS
        # The answer never appears in its question (whole words, case-insensitive).
        assert not re.search(rf"(?<!\w){re.escape(base_title(answer).lower())}(?!\w)", r["question"].lower())
        if r["type"] == "describe":
            assert r["question"].endswith(f' is "{DOCS[answer].meta["description"]}"?')
            assert descriptions[DOCS[answer].meta["description"]] == 1
        elif r["type"] == "bridge":
            a, b = r["support"]
            assert re.search(rf"(?<!\w){re.escape(b)}(?!\w)", DOCS[a].text)  # B is named in A's lead
            assert descriptions[DOCS[b].meta["description"]] >= 2  # B's description alone is ambiguous
            assert descriptions[DOCS[a].meta["description"]] == 1


def test_splits_are_answer_disjoint_and_seeded():
    train, test = load_wiki_qa("train"), load_wiki_qa("test")
    assert not {r["answers"][0] for r in train} & {r["answers"][0] for r in test}
    assert round(len({r["answers"][0] for r in _all_questions()}) * 0.2) == len(
        {r["answers"][0] for r in test}
    )
    assert load_wiki_qa("test") == test  # deterministic
    other = load_wiki_qa("test", seed=1)
    assert {r["task_id"] for r in other} != {r["task_id"] for r in test}
    bridges = load_wiki_qa("test", types=["bridge"], limit=5)
    assert len(bridges) == 5 and {r["type"] for r in bridges} == {"bridge"}


def test_wiki_qa_bad_arguments():
    with pytest.raises(ValueError, match="split must be one of"):
        load_wiki_qa("dev")
    with pytest.raises(ValueError, match=r"types: unknown question type\(s\) \['trivia'\]"):
        load_wiki_qa("test", types=["trivia"])
    with pytest.raises(ValueError, match="test_fraction"):
        load_wiki_qa("test", test_fraction=1.0)
    assert set(QA_TYPES) == {"describe", "define", "bridge"}


def test_freshqa():
    test, dev = load_freshqa("test"), load_freshqa("dev")
    # 500 TEST / 100 DEV rows in FreshQA_v12182024.csv; 123 / 25 of them rest on a false premise.
    assert (len(test), len(dev)) == (377, 75)
    assert (
        len(load_freshqa("test", include_false_premise=True)),
        len(load_freshqa("dev", include_false_premise=True)),
    ) == (
        500,
        100,
    )
    row = test[1]
    assert row["question"] == "How many humans have landed on Mars?"
    assert row["answers"] == ["No humans have been to Mars yet.", "0", "zero", "none"]
    assert row["task_id"] == "freshqa/124" and row["support"] == [] and not row["false_premise"]
    with pytest.raises(ValueError, match="eval-only"):
        load_freshqa("train")


@pytest.mark.parametrize(
    ("pred", "refs", "em", "f1"),
    [
        ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0),
        ("Paris", ["Paris, France"], 0.0, 2 / 3),  # P = 1/1, R = 1/2 -> 2PR/(P+R) = 2/3
        ("e b c d", ["b c x"], 0.0, 4 / 7),  # common 2: P = 2/4, R = 2/3 -> 4/7
        ("", ["x"], 0.0, 0.0),
        ("the", ["a"], 1.0, 1.0),  # both normalise to "": SQuAD counts it as a match
        ("Kraków", ["Krakow"], 0.0, 0.0),  # no accent folding, as in SQuAD
        ("two two", ["two"], 0.0, 2 / 3),  # multiplicity: common 1, P = 1/2, R = 1
    ],
)
def test_qa_metrics(pred, refs, em, f1):
    assert exact_match(pred, refs) == em
    assert token_f1(pred, refs) == pytest.approx(f1)


def test_normalize_answer():
    assert normalize_answer("  The  Beatles'  'Abbey Road' ") == "beatles abbey road"
    assert exact_match("x", ["y", "X."]) == 1.0

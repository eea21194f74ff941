"""Search-v0: tool and Search-R1 tag modes over the real Wikipedia corpus with the real BM25 index,
exact-match reward and F1, the search cap, the token budget of retrieved text, and failure paths.
"""

import json
import re

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.messages import message_errors
from chatgym.envs.search.env import SearchEnv, cut_to_token_budget, format_passages
from chatgym.retrievers.base import Document
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.client import RetrievalClient
from chatgym.retrievers.corpora import wiki_corpus

KUBRICK = {
    "task_id": "t0",
    "question": "What is a 1968 epic science fiction film produced and directed by Stanley Kubrick?",
    "answers": ["2001: A Space Odyssey"],
}


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def bm25():
    # Built independently of the env, to compare against what the env retrieves.
    return BM25Retriever(wiki_corpus())


def make(cache_dir, **kw) -> SearchEnv:
    return SearchEnv(cache_dir=cache_dir, **kw)


def test_registered_env_passes_check_env():
    env = gym.make("Search-v0")
    check_env(env.unwrapped)
    obs, info = env.reset(seed=0)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[1]["content"].startswith("Question: ")
    assert [t["function"]["name"] for t in info["tools"]] == ["search"]
    env.close()


def test_tool_mode_episode(cache_dir, bm25):
    env = make(cache_dir, topk=3)
    obs, _ = env.reset(options={"task": KUBRICK})
    assert "`search` tool" in obs[0]["content"] and obs[1]["content"] == f"Question: {KUBRICK['question']}"

    obs, reward, terminated, truncated, info = env.step(call("search", query="1968 film Stanley Kubrick"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    (msg,) = obs
    assert msg["role"] == "tool" and msg["name"] == "search" and not message_errors(msg)
    want = bm25.search("1968 film Stanley Kubrick", 3)
    assert info["retrieved_ids"] == [p.id for p in want] and info["searches"] == 1
    assert msg["content"] == format_passages(want)  # 3 passages, well under the 512-word budget
    assert msg["content"].startswith("Doc 1 (Title: ")
    assert "2001: A Space Odyssey" in info["retrieved_ids"]

    obs, reward, terminated, truncated, info = env.step("It is <answer>2001: A Space Odyssey</answer>")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["em"] == 1.0 and info["f1"] == 1.0 and info["searches"] == 1
    assert info["reward_components"] == {"em": 1.0, "format": 1.0}
    env.close()


def test_partial_answer_gets_f1_not_reward(cache_dir):
    env = make(cache_dir)
    env.reset(options={"task": KUBRICK})
    _, reward, terminated, _, info = env.step("<answer>A Space Odyssey</answer>")
    # normalised: "space odyssey" vs "2001 space odyssey": P = 2/2, R = 2/3, F1 = 2PR/(P+R) = 0.8
    assert (reward, terminated) == (0.0, True)
    assert info["f1"] == pytest.approx(0.8) and info["em"] == 0.0
    env.reset(options={"task": KUBRICK})
    _, reward, _, _, info = env.step("the 2001 - a space odyssey!")  # no tag: whole reply, normalised
    assert reward == 1.0 and info["reward_components"]["format"] == 0.0
    env.close()


def test_two_searches_in_one_turn_and_empty_query(cache_dir):
    env = make(cache_dir, topk=2)
    env.reset(options={"task": KUBRICK})
    obs, reward, terminated, _, info = env.step(
        call("search", query="Stanley Kubrick") + call("search", query="HAL 9000")
    )
    assert [m["role"] for m in obs] == ["tool", "tool"] and info["searches"] == 2
    assert (reward, terminated) == (0.0, False)
    obs, _, terminated, _, info = env.step(call("search", query="   "))
    assert obs[0]["content"] == "Error: the search query is empty."
    assert info["tool_errors"] == 1 and info["searches"] == 2 and not terminated
    env.close()


def test_search_cap(cache_dir):
    env = make(cache_dir, mode="tags", max_searches=2)
    assert env.max_turns == 3
    env.reset(options={"task": KUBRICK})
    for i in (1, 2):
        obs, _, terminated, truncated, info = env.step(f"<search>Kubrick film {i}</search>")
        assert obs[0]["content"].startswith("<information>Doc 1 (Title: ") and info["searches"] == i
    obs, _, terminated, truncated, info = env.step("<search>one more</search>")
    assert obs == [
        {
            "role": "user",
            "content": "<information>Search limit reached (2 searches). Give your final answer now.</information>",
        }
    ]
    assert info["searches"] == 2 and info["search_error"] == "limit"
    assert (terminated, truncated) == (False, True)  # 3 turns = max_turns
    env.close()


def test_tags_mode_follows_search_r1(cache_dir, bm25):
    env = make(cache_dir, mode="tags", topk=3)
    obs, info = env.reset(options={"task": KUBRICK})
    assert info["tools"] == [] and env.stop_strings == ["</search>", "</answer>"]
    assert "<search>" in obs[0]["content"]
    obs, reward, terminated, _, info = env.step(
        "<think>find the film</think>\n<search> Stanley Kubrick 1968 </search>"
    )
    (msg,) = obs
    assert msg["role"] == "user"
    assert (
        msg["content"]
        == f"<information>{format_passages(bm25.search('Stanley Kubrick 1968', 3))}</information>"
    )
    # History keeps the raw turn: no tool-call parsing in tags mode.
    assert (
        env.messages[2]["content"] == "<think>find the film</think>\n<search> Stanley Kubrick 1968 </search>"
    )

    obs, reward, terminated, _, info = env.step("no tags at all")
    assert reward == 0.0 and not terminated and info["invalid_action"] is True
    assert obs[0]["role"] == "user" and "<search>" in obs[0]["content"]

    # The first tag wins: an answer before a search ends the episode.
    obs, reward, terminated, _, info = env.step("<answer> 2001: a space odyssey </answer> <search>x</search>")
    assert (obs, reward, terminated) == ([], 1.0, True)
    env.close()


def test_token_budget_in_words_and_in_policy_tokens(cache_dir, bm25):
    full = format_passages(bm25.search("Stanley Kubrick", 3))
    env = make(cache_dir, mode="tags", max_passage_tokens=20)
    env.reset(options={"task": KUBRICK})
    obs, *_, info = env.step("<search>Stanley Kubrick</search>")
    body = obs[0]["content"].removeprefix("<information>").removesuffix("</information>")
    assert len(body.split()) == 20 and full.startswith(body) and info["obs_truncated"] is True

    from transformers import AutoTokenizer

    from chatgym.retrievers.dense import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path())  # a real (WordPiece) tokenizer
    env = make(cache_dir, mode="tags", max_passage_tokens=31, tokenizer=tok)
    env.reset(options={"task": KUBRICK})
    obs, *_ = env.step("<search>Stanley Kubrick</search>")
    body = obs[0]["content"].removeprefix("<information>").removesuffix("</information>")
    assert full.startswith(body) and len(tok(body, add_special_tokens=False)["input_ids"]) == 31
    env.close()


def test_cut_to_token_budget_edges():
    assert cut_to_token_budget("a  b\nc d", 3) == ("a  b\nc", True)
    assert cut_to_token_budget("a b", 2) == ("a b", False)
    assert cut_to_token_budget("a b", None) == ("a b", False)
    with pytest.raises(ValueError, match="max_passage_tokens must be >= 1"):
        cut_to_token_budget("a", 0)


def test_search_bonus_needs_passages_and_a_tagged_answer(cache_dir):
    env = make(cache_dir, mode="tags", max_searches=2, search_bonus=0.25)
    # A search that returned passages, then a wrong tagged answer: 0 (EM) + 0.25; success stays False.
    env.reset(options={"task": KUBRICK})
    env.step("<search>Kubrick 1968 film</search>")
    _, reward, _, _, info = env.step("<answer>Dune</answer>")
    assert reward == 0.25 and info["success"] is False
    assert info["reward_components"] == {"em": 0.0, "format": 1.0, "search_bonus": 0.25}
    # The right answer after a search: 1 + 0.25.
    env.reset(options={"task": KUBRICK})
    env.step("<search>Kubrick 1968 film</search>")
    _, reward, *_ = env.step("<answer>2001: A Space Odyssey</answer>")
    assert reward == 1.25
    # A search with no result (BM25 drops the stop word "and", as when the model copies the hint's
    # "between <search> and </search>") is no passage: no bonus.
    env.reset(options={"task": KUBRICK})
    obs, *_ = env.step("<search> and </search>")
    assert obs[0]["content"] == "<information>No results.</information>"
    _, reward, *_ = env.step("<answer>Dune</answer>")
    assert reward == 0.0
    # No search: no bonus.
    env.reset(options={"task": KUBRICK})
    _, reward, *_, info = env.step("<answer>2001: A Space Odyssey</answer>")
    assert reward == 1.0 and info["reward_components"]["search_bonus"] == 0.0
    env.close()
    # Tool mode: a search that failed is no bonus, nor is an untagged answer after a good search.
    dead = RetrievalClient("http://127.0.0.1:9", retries=0, timeout_s=2)
    env = make(cache_dir, retriever=dead, search_bonus=0.25)
    env.reset(options={"task": KUBRICK})
    env.step(call("search", query="anything"))
    _, reward, *_ = env.step("<answer>Dune</answer>")
    assert reward == 0.0
    env.close()
    env = make(cache_dir, search_bonus=0.25)
    env.reset(options={"task": KUBRICK})
    env.step(call("search", query="Kubrick 1968 film"))
    _, reward, *_, info = env.step("Dune")
    assert reward == 0.0 and info["reward_components"] == {"em": 0.0, "format": 0.0, "search_bonus": 0.0}
    env.close()


def test_failed_search_is_an_observation(cache_dir):
    dead = RetrievalClient("http://127.0.0.1:9", retries=0, timeout_s=2)
    env = make(cache_dir, retriever=dead)
    env.reset(options={"task": KUBRICK})
    obs, reward, terminated, _, info = env.step(call("search", query="anything"))
    assert re.match(r"Error: search failed \(RetrievalError: .*127\.0\.0\.1:9", obs[0]["content"])
    assert info["search_error"] == "RetrievalError" and info["tool_errors"] == 1
    assert (reward, terminated) == (0.0, False)
    env.close()


def test_custom_retriever_object(cache_dir):
    tiny = BM25Retriever([Document("a", "Mount Everest is the highest mountain.", {"title": "Everest"})])
    env = make(cache_dir, retriever=tiny, mode="tags")
    env.reset(options={"task": {"question": "Highest mountain?", "answers": ["Mount Everest", "Everest"]}})
    obs, *_ = env.step("<search>highest mountain</search>")
    assert obs[0]["content"].startswith("<information>Doc 1 (Title: Everest) Mount Everest is the highest")
    assert env.step("<answer>Everest</answer>")[1] == 1.0
    env.close()


async def test_async_api_with_wiki_qa_rows(cache_dir):
    env = make(cache_dir, split="test", qa_types=["describe"])
    obs, info = await env.areset(options={"task_index": 0})
    task = env.task
    assert task["type"] == "describe" and info["task_id"] == task["task_id"]
    assert obs[1]["content"] == f"Question: {task['question']}"
    _, reward, terminated, _, info = await env.astep(f"<answer>{task['answers'][0]}</answer>")
    assert (reward, terminated) == (1.0, True)
    await env.aclose()


def test_freshqa_dataset(cache_dir):
    env = make(cache_dir, dataset="freshqa", split="test")
    obs, _ = env.reset(options={"task_index": 1})
    assert obs[1]["content"] == "Question: How many humans have landed on Mars?"
    _, reward, *_ = env.step("<answer>zero</answer>")  # one of the accepted answers
    assert reward == 1.0
    with pytest.raises(ValueError, match="split must be one of"):
        make(cache_dir, dataset="freshqa", split="train")
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "xml"}, "mode must be one of"),
        ({"dataset": "nq"}, "dataset must be one of"),
        ({"retriever": "splade"}, "retriever must be"),
        ({"topk": 0}, "topk must be >= 1"),
        ({"max_searches": -1}, "max_searches must be >= 0"),
        ({"max_passage_tokens": 0}, "max_passage_tokens must be >= 1"),
        ({"search_bonus": -0.5}, "search_bonus must be >= 0, got -0.5"),
        ({"split": "dev"}, "split must be one of"),
        # Regression: tags mode replaced a parser it was given without a word.
        ({"mode": "tags", "parser": "json"},
         r"^Search-v0 in tags mode takes no parser \(got 'json'\): it reads <search> and <answer> tags from the "
         r"raw text; mode='tool' parses tool calls$"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SearchEnv(**kwargs)


def test_bad_task_row_names_the_field(cache_dir):
    env = make(cache_dir)
    with pytest.raises(ValueError, match=r"task\['answers'\]"):
        env.reset(options={"task": {"question": "q", "answers": "not a list"}})
    with pytest.raises(ValueError, match=r"task\['question'\]"):
        env.reset(options={"task": {"question": " ", "answers": ["a"]}})
    env.close()

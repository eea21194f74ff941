"""Search-v0: answer questions by searching a Wikipedia corpus.

Each episode is one question (WikiQA, built from the corpus, or FreshQA; see
``chatgym.envs.datasets``). The agent searches, reads the passages, and answers:

* ``mode="tool"`` (default): a ``search(query)`` tool (OpenAI function schema, parsed from the text
  by ``parser``); the passages come back as a ``tool`` message. A turn without a tool call is the
  final answer; the text inside the last ``<answer>…</answer>`` counts (the whole reply when there is
  no tag, with ``info["reward_components"]["format"] = 0``).
* ``mode="tags"`` (Search-R1, Jin et al. 2025, arXiv:2503.09516): the turn holds ``<search> query
  </search>`` or ``<answer> … </answer>`` — the first of the two in the text wins, as in Search-R1 —
  and the passages come back as a ``user`` message ``<information>…</information>``. A turn with
  neither gets a hint and the episode goes on. ``env.stop_strings`` lists the closing tags at which
  generation should stop.

Passages are observations. The rollout collector gives every observation token loss mask 0, so
retrieved text is never trained on; nothing more is needed here than returning it as a ``tool`` /
``user`` message. The passages of one search are cut to ``max_passage_tokens`` tokens of ``tokenizer``
(any ``transformers`` tokenizer — pass the policy's, so the budget is in its tokens); without a
tokenizer the budget counts whitespace-separated words. ``info["obs_truncated"]`` says when a cut
happened.

Reward: 1.0 when the answer equals a reference after SQuAD normalisation (exact match), else 0.0;
``info["f1"]`` holds the token F1 (see ``chatgym.envs.search.qa_metrics``). ``search_bonus`` (default 0) is
a format reward added when the episode ran a search that returned passages and the answer was in
``<answer>`` tags (shaping for small models that never search on their own; ``info["success"]`` stays
exact match alone). At most ``max_searches``
searches run per episode; later ones are answered with a notice instead of passages. An empty query,
a failed search or a malformed turn becomes a message to the model, never an exception.

Retrieval is in-process (``retriever="bm25" | "dense" | "hybrid"``, built once over the corpus and
cached on disk under ``$CHATGYM_CACHE``; or any retriever object) or remote
(``retriever_url="http://127.0.0.1:8000"``, a ``chatgym serve-retriever`` server).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import threading
from collections.abc import Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs import tool_gate
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.parsers import PlainText
from chatgym.envs.search.qa_metrics import exact_match, token_f1
from chatgym.envs.tools import Tool, ToolResult

MODES = ("tool", "tags")
DATASETS = ("wiki_qa", "freshqa")

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.S | re.I)
_WORD = re.compile(r"\S+")

INVALID_TAGS_HINT = (
    "Your previous turn had no <search>…</search> and no <answer>…</answer>. To search, put a query "
    "between <search> and </search>. To answer, put the answer between <answer> and </answer>."
)


def cut_to_token_budget(text: str, budget: int | None, tokenizer: Any = None) -> tuple[str, bool]:
    """Cut ``text`` to its first ``budget`` tokens; returns ``(text, was_cut)``.

    Args:
        text: the text to cut.
        budget: most tokens kept (``None``: no limit; ``>= 1``).
        tokenizer: a ``transformers`` tokenizer (fast ones cut at the character offset where token
            ``budget`` ends, so the original text is kept; slow ones decode the first ``budget`` ids),
            or None to count whitespace-separated words.

    Raises:
        ValueError: ``budget < 1``.
    """
    if budget is None:
        return text, False
    if budget < 1:
        raise ValueError(f"max_passage_tokens must be >= 1 or None, got {budget}")
    if tokenizer is None:
        words = list(_WORD.finditer(text))
        return (text, False) if len(words) <= budget else (text[: words[budget - 1].end()], True)
    if getattr(tokenizer, "is_fast", False):
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return (text, False) if len(offsets) <= budget else (text[: offsets[budget - 1][1]], True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return (text, False) if len(ids) <= budget else (tokenizer.decode(ids[:budget]), True)


def format_passages(passages: Sequence[Any]) -> str:
    """Search-R1's layout: one ``Doc i (Title: t) text`` line per passage, 1-based."""
    if not passages:
        return "No results."
    return "\n".join(f"Doc {i} (Title: {p.title or p.id}) {p.text}" for i, p in enumerate(passages, 1))


_SHARED_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _shared_wiki_retriever(kind: str, cache_dir: str | None) -> Any:
    """One in-process retriever per kind, shared by every env of the process."""
    from chatgym.retrievers.build import cached_retriever
    from chatgym.retrievers.corpora import wiki_corpus

    return cached_retriever(kind, wiki_corpus(), cache_dir=cache_dir)


class SearchEnv(ChatEnv):
    """Search-v0 (see the module docstring).

    Args:
        dataset: ``"wiki_qa"`` (train/test) or ``"freshqa"`` (eval-only: test/dev).
        split: the dataset split.
        seed: seed of WikiQA's split and order.
        qa_types: WikiQA question kinds (``describe``, ``define``, ``bridge``).
        mode: ``"tool"`` or ``"tags"``.
        retriever: ``"bm25"``, ``"dense"``, ``"hybrid"`` (in-process over the Wikipedia corpus) or
            an object with ``search_batch(queries, k)`` (sync or async).
        retriever_url: base URL of a retrieval server; overrides ``retriever``.
        topk: passages per search.
        max_searches: searches allowed per episode (>= 0).
        max_passage_tokens: token budget of one search's passages (None: unlimited).
        search_bonus: reward added to the answer's when a search returned passages and the answer
            was tagged (>= 0; ``info["reward_components"]["search_bonus"]`` when set).
        tokenizer: tokenizer that counts ``max_passage_tokens`` (None: whitespace words).
        max_turns: assistant turns before truncation (default ``max_searches + 1``).
        cache_dir: index cache root (default ``$CHATGYM_CACHE`` or ``~/.cache/chatgym``).
        kwargs: passed to :class:`ChatEnv` (``parser`` in tool mode, ``tool_timeout_s``, ``render_mode``).

    Raises:
        ValueError: unknown dataset, mode, retriever kind or split; ``topk < 1``;
            ``max_searches < 0``; ``max_passage_tokens < 1``; ``search_bonus < 0``; a ``parser`` in
            tags mode (it reads the tags from the raw text).
    """

    def __init__(
        self,
        *,
        dataset: str = "wiki_qa",
        split: str = "test",
        seed: int = 0,
        qa_types: Sequence[str] | None = None,
        mode: str = "tool",
        retriever: str | Any = "bm25",
        retriever_url: str | None = None,
        topk: int = 3,
        max_searches: int = 4,
        max_passage_tokens: int | None = 512,
        search_bonus: float = 0.0,
        tokenizer: Any = None,
        max_turns: int | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ):
        if dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(retriever, str) and retriever not in ("bm25", "dense", "hybrid"):
            raise ValueError(
                f"retriever must be 'bm25', 'dense', 'hybrid' or a retriever object, got {retriever!r}"
            )
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if max_searches < 0:
            raise ValueError(f"max_searches must be >= 0, got {max_searches}")
        if max_passage_tokens is not None and max_passage_tokens < 1:
            raise ValueError(f"max_passage_tokens must be >= 1 or None, got {max_passage_tokens}")
        if not search_bonus >= 0:
            raise ValueError(f"search_bonus must be >= 0, got {search_bonus}")
        valid_splits = ("train", "test") if dataset == "wiki_qa" else ("test", "dev")
        if split not in valid_splits:
            raise ValueError(f"split must be one of {valid_splits} for dataset {dataset!r}, got {split!r}")
        self.mode = mode
        tools = [self._make_search_tool()] if mode == "tool" else []
        if mode == "tags":
            if "parser" in kwargs:  # it was silently replaced: a user's parser never ran
                raise ValueError(
                    f"Search-v0 in tags mode takes no parser (got {kwargs['parser']!r}): it reads <search> and "
                    "<answer> tags from the raw text; mode='tool' parses tool calls"
                )
            kwargs["parser"] = PlainText()
        super().__init__(split=split, tools=tools, max_turns=max_turns or max_searches + 1, **kwargs)
        self.dataset = dataset
        self.seed = seed
        self.qa_types = tuple(qa_types) if qa_types is not None else None
        self.retriever_spec = retriever
        self.retriever_url = retriever_url
        self.topk = topk
        self.max_searches = max_searches
        self.max_passage_tokens = max_passage_tokens
        self.search_bonus = float(search_bonus)
        self.tokenizer = tokenizer
        self.cache_dir = cache_dir
        self.stop_strings = ["</search>", "</answer>"] if mode == "tags" else []
        prompt = "search_tool_system.txt" if mode == "tool" else "search_tags_system.txt"
        self.system_prompt = load_prompt(__package__, prompt).format(topk=topk, max_searches=max_searches)
        self.searches = 0
        self.searches_ok = 0  # searches that returned passages (not an error, limit notice or no result)
        self._retriever: Any = None
        self._owns_client = False

    # ---- data ---------------------------------------------------------------------------------

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        if self.dataset == "freshqa":
            from chatgym.envs.search.freshqa import load_freshqa

            return load_freshqa(split)
        from chatgym.envs.search.wiki_qa import QA_TYPES, TEST_FRACTION, load_wiki_qa, split_rows

        types = self.qa_types or QA_TYPES
        load_wiki_qa(split, seed=self.seed, types=types, limit=0)  # validates the arguments
        return split_rows(split, self.seed, TEST_FRACTION, tuple(types))

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.system(self.system_prompt), M.user(f"Question: {task['question']}")]

    async def on_reset(self, task: dict[str, Any]) -> None:
        if not isinstance(task.get("question"), str) or not task["question"].strip():
            raise ValueError("task['question'] must be a non-empty string")
        answers = task.get("answers")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError("task['answers'] must be a non-empty list of strings")
        self.searches = 0
        self.searches_ok = 0

    # ---- retrieval ----------------------------------------------------------------------------

    def _get_retriever(self) -> Any:
        if self._retriever is None:
            if self.retriever_url is not None:
                from chatgym.retrievers.client import RetrievalClient

                self._retriever = RetrievalClient(self.retriever_url)
                self._owns_client = True
            elif isinstance(self.retriever_spec, str):
                with _SHARED_LOCK:
                    self._retriever = _shared_wiki_retriever(self.retriever_spec, self.cache_dir)
            else:
                self._retriever = self.retriever_spec
        return self._retriever

    async def search(self, query: str) -> tuple[str, dict[str, Any]]:
        """Run one search for the agent; returns ``(observation text, info)``. Never raises."""
        query = query.strip()
        if not query:
            return "Error: the search query is empty.", {"search_error": "empty query"}
        if self.searches >= self.max_searches:
            text = f"Search limit reached ({self.max_searches} searches). Give your final answer now."
            return text, {"search_error": "limit"}
        self.searches += 1
        try:
            if self._retriever is None:
                await asyncio.to_thread(self._get_retriever)
            r = self._retriever
            async with tool_gate.slot("retrieval"):
                if inspect.iscoroutinefunction(r.search_batch):
                    hits = (await r.search_batch([query], self.topk))[0]
                else:
                    hits = (await asyncio.to_thread(r.search_batch, [query], self.topk))[0]
        except Exception as exc:  # a retrieval failure is an observation, not a crashed episode
            return f"Error: search failed ({type(exc).__name__}: {exc}).", {
                "search_error": type(exc).__name__
            }
        text, cut = cut_to_token_budget(format_passages(hits), self.max_passage_tokens, self.tokenizer)
        self.searches_ok += bool(hits)  # "No results." is no passage to read
        return text, {"obs_truncated": cut, "retrieved_ids": [p.id for p in hits]}

    def _make_search_tool(self) -> Tool:
        async def run(query: str) -> ToolResult:
            text, info = await self.search(query)
            return ToolResult(content=text, is_error="search_error" in info, info=info)

        return Tool(
            name="search",
            description="Search English Wikipedia lead sections and return the most relevant passages.",
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "description": "a short search query"}},
                "required": ["query"],
                "additionalProperties": False,
            },
            fn=run,
        )

    # ---- turns and reward ---------------------------------------------------------------------

    def _grade(self, answer: str, tagged: bool) -> StepOutcome:
        assert self.task is not None
        refs = self.task["answers"]
        em = exact_match(answer, refs)
        bonus = self.search_bonus if self.searches_ok and tagged else 0.0
        info = {
            "answer": answer,
            "references": list(refs),
            "em": em,
            "f1": token_f1(answer, refs),
            "searches": self.searches,
            "reward_components": {"em": em, "format": float(tagged)},
            "success": em == 1.0,
        }
        if self.search_bonus:
            info["reward_components"]["search_bonus"] = bonus
        return StepOutcome(reward=em + bonus, terminated=True, info=info)

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        tags = _ANSWER.findall(turn.raw_text)
        if tags:
            return self._grade(tags[-1].strip(), True)
        return self._grade(turn.parsed.content.strip(), False)

    def reference_action(self) -> str:
        """The task's first reference answer in ``<answer>`` tags (read the same way in both modes).

        Raises:
            RuntimeError: called before ``reset``.
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        return f"<answer>{self.task['answers'][0]}</answer>"

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        if self.mode == "tool":
            out = await super().react(turn)
            out.info.setdefault("searches", self.searches)
            return out
        m = _ACTION.search(turn.raw_text)
        if m is None:
            return StepOutcome(messages=[M.user(INVALID_TAGS_HINT)], info={"invalid_action": True})
        if m.group(1).lower() == "answer":
            return self._grade(m.group(2).strip(), True)
        text, info = await self.search(m.group(2))
        info["searches"] = self.searches
        return StepOutcome(messages=[M.user(f"<information>{text}</information>")], info=info)

    async def aclose(self) -> None:
        if self._owns_client and self._retriever is not None:
            await self._retriever.aclose()
            self._retriever = None
        await super().aclose()

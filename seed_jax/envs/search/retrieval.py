"""Retrievers for search-QA: local BM25 (`bm25s`) and a client for a retrieval server.

Both answer `retrieve(queries, topk) -> [[doc, ...] per query]` where a doc is a wiki-18
record `{"id", "contents"}` (title on the first line). The server API is Search-R1's:
`POST /retrieve` with `{"queries": [...], "topk": k, "return_scores": bool}` answers
`{"result": [[{"document": doc, "score": s}, ...] per query]}` (or bare docs without scores).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, Protocol, Sequence

import bm25s
import numpy as np

Doc = dict[str, Any]


class Retriever(Protocol):

  def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Doc]]:
    ...


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
  # English stopwords out, no stemming: names of invented entities must match exactly.
  return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
  """A BM25 index over a list of texts; `search` returns (indices, scores) per query.

  Used by the search env (over passages) and by WebShop (over product text).
  """

  def __init__(self, texts: Sequence[str]):
    if not texts:
      raise ValueError("BM25Index needs at least one text")
    self._size = len(texts)
    self._bm25 = bm25s.BM25()
    self._bm25.index(_tokenize(texts), show_progress=False)
    # bm25s keeps per-query scratch state; serialise queries from server threads.
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self._size

  def search(self, queries: Sequence[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns (indices `[Q, k]` int, scores `[Q, k]` float), best first, k = min(topk, size).

    A query with no indexed word scores 0 everywhere; it still gets k (arbitrary) results,
    as a search engine shows something for any query.
    """
    k = max(1, min(int(topk), self._size))
    tokens = [tokens or ["<empty>"] for tokens in _tokenize(queries)]
    with self._lock:
      indices, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    return np.asarray(indices), np.asarray(scores)


class BM25Retriever:
  """BM25 over a wiki-18-style corpus (records with "contents", title on the first line)."""

  def __init__(self, docs: Sequence[Doc]):
    self._docs = list(docs)
    self._index = BM25Index([doc["contents"] for doc in self._docs])

  def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Doc]]:
    return [docs for docs, _ in self.retrieve_with_scores(queries, topk)]

  def retrieve_with_scores(self, queries: Sequence[str],
                           topk: int) -> list[tuple[list[Doc], list[float]]]:
    """Per query, the top-k docs and their BM25 scores."""
    if not queries:
      return []
    indices, scores = self._index.search(queries, topk)
    return [([self._docs[i] for i in row], [float(s) for s in srow])
            for row, srow in zip(indices, scores)]


class RemoteRetriever:
  """A client for a Search-R1-style retrieval server (`POST {url}` with the JSON above)."""

  def __init__(self, url: str, timeout_s: float = 30.0):
    self._url = url
    self._timeout_s = timeout_s

  def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Doc]]:
    body = json.dumps({"queries": list(queries), "topk": int(topk),
                       "return_scores": False}).encode()
    request = urllib.request.Request(self._url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
      with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
        result = json.loads(response.read())["result"]
    except urllib.error.HTTPError as e:
      raise RuntimeError(
          f"retrieval server {self._url} answered {e.code}: {e.read()[:200]!r}") from e
    # Servers that return scores anyway wrap each doc as {"document": doc, "score": s}.
    return [[item.get("document", item) for item in docs] for docs in result]


def split_title(doc: Doc) -> tuple[str, str]:
  """(title, text) of a wiki-18 record; the title line may be wrapped in double quotes."""
  contents = doc.get("contents", "")
  title, _, text = contents.partition("\n")
  return title.strip().strip('"'), text.strip()


def format_passages(docs: Sequence[Doc]) -> str:
  """Search-R1's rendering of retrieved passages: `Doc i(Title: t) text`, one a line."""
  lines = []
  for rank, doc in enumerate(docs, start=1):
    title, text = split_title(doc)
    lines.append(f"Doc {rank}(Title: {title}) {text}")
  return "\n".join(lines)

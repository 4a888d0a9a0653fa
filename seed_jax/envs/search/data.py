"""Loaders for question sets and corpora a user brings (NQ / HotpotQA style).

Accepted question files, one record per question:
  - jsonl or json (a list): FlashRAG / Search-R1 style `{"question", "golden_answers"}`,
    HotpotQA style `{"question", "answer"}`, or `{"question", "answers"}`;
  - parquet (needs `pyarrow`): Search-R1's processed files, where the answers sit in
    `reward_model.ground_truth.target` and the question in a `question` column or in
    `extra_info` / the prompt text.
The dataset name ("nq", "hotpotqa", ...) comes from a `data_source` field or else from the
file name, so results can be reported per dataset.

A corpus is a wiki-18-format jsonl file: `{"id", "contents"}` with the title on the first
line of contents. (The full wiki-18 corpus is too big for in-process BM25: serve it with
`python -m seed_jax.envs.search.serve` on a larger machine, or use a dense server, and set
`retriever="remote"`.)
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from seed_jax.envs.search import corpus as corpus_lib


def _read_records(path: pathlib.Path) -> list[dict[str, Any]]:
  if path.suffix == ".parquet":
    try:
      import pyarrow.parquet as pq  # optional: only for Search-R1's parquet files
    except ImportError as e:
      raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from e
    return pq.read_table(path).to_pylist()
  if path.suffix == ".json":
    with open(path) as f:
      data = json.load(f)
    return data if isinstance(data, list) else data["data"]
  return corpus_lib.read_jsonl(path)


def _as_list(value: Any) -> list[str]:
  if value is None:
    return []
  if isinstance(value, (list, tuple)):
    return [str(v) for v in value]
  if hasattr(value, "tolist"):  # numpy arrays from parquet
    return [str(v) for v in value.tolist()]
  return [str(value)]


def normalize_record(raw: dict[str, Any], default_source: str) -> dict[str, Any]:
  """One question record in the env's own shape: `{"question", "golden_answers",
  "data_source"}` (plus "expert_queries" when the record names supporting titles)."""
  question = raw.get("question") or (raw.get("extra_info") or {}).get("question")
  if not question and raw.get("prompt"):
    # Search-R1 parquet keeps only the templated prompt; the question ends it.
    content = raw["prompt"][0]["content"]
    question = content.rsplit("Question:", 1)[-1].strip()
  answers = (_as_list(raw.get("golden_answers")) or _as_list(raw.get("answers"))
             or _as_list(raw.get("answer"))
             or _as_list(((raw.get("reward_model") or {}).get("ground_truth") or {}).get("target")))
  if not question or not answers:
    raise ValueError(f"record lacks a question or answers: {str(raw)[:200]}")
  record = {"question": str(question).strip(), "golden_answers": answers,
            "data_source": str(raw.get("data_source") or default_source)}
  titles = raw.get("expert_queries") or [fact[0] for fact in raw.get("supporting_facts", [])]
  if titles:
    record["expert_queries"] = list(dict.fromkeys(str(t) for t in titles))  # unique, in order
  return record


def load_questions(paths: list[str]) -> list[dict[str, Any]]:
  """All questions of the given files, in file order."""
  questions = []
  for name in paths:
    path = pathlib.Path(name).expanduser()
    source = path.stem.split("_")[0].split("-")[0].lower()
    questions.extend(normalize_record(raw, source) for raw in _read_records(path))
  return questions


def load_corpus(path: str) -> list[dict[str, Any]]:
  """A wiki-18-format jsonl corpus; records must have "contents" (an "id" is added if
  missing)."""
  docs = corpus_lib.read_jsonl(pathlib.Path(path).expanduser())
  for index, doc in enumerate(docs):
    if "contents" not in doc:
      raise ValueError(f"{path}: record {index} has no 'contents' field")
    doc.setdefault("id", str(index))
  return docs

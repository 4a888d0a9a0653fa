"""Search-based QA (Search-R1 protocol): `<search>` / `<answer>` turns over a retriever.

The env-module contract of `seed_jax.envs.registry`. By default the data is embedded: a
generated corpus of passages about fictional entities with single-hop, bridge and
comparison questions (`corpus.py`), cached under `$SEED_JAX_CACHE/search/`. Users who have
NQ / HotpotQA files and a wiki-18 corpus (or a retrieval server) point the config at them:

  --config.qa_files.valid_seen=/data/nq_test.jsonl,/data/hotpotqa_dev.parquet
  --config.corpus_path=/data/wiki-18.jsonl          (local BM25, small corpora)
  --config.retriever=remote --config.retrieval_url=http://127.0.0.1:8000/retrieve
"""

from __future__ import annotations

import ml_collections

from seed_jax.envs import base
from seed_jax.envs.search import corpus, data, retrieval
from seed_jax.envs.search.env import SearchEnv, random_action  # noqa: F401  (play uses it)
from seed_jax.envs.search.prompt import SearchFormat

NAME = "search"

# A retriever per corpus and process: every env of a pool worker shares one BM25 index.
_RETRIEVERS: dict[str, retrieval.BM25Retriever] = {}


def default_config() -> ml_collections.ConfigDict:
  """Data sources, retriever and protocol settings."""
  return ml_collections.ConfigDict({
      "max_steps": 4,  # Search-R1 / SEED turn limit
      "topk": 3,  # passages per search
      "retriever": "bm25",  # "bm25" (in process) or "remote" (a retrieval server)
      "retrieval_url": "http://127.0.0.1:8000/retrieve",
      "corpus_path": "",  # wiki-18-format jsonl; "" = the embedded corpus
      # Comma-separated question files per split; "" = the embedded questions.
      "qa_files": {"train": "", "valid_seen": "", "valid_unseen": ""},
      "embedded": {
          "seed": 0,
          "num_people": 2000,  # about 3,300 passages in all
          "questions_per_kind": 1000,  # single, bridge, comparison
          "num_eval": 300,  # questions in each of valid_seen and valid_unseen
      },
  })


def embedded_data_paths(config: ml_collections.ConfigDict):
  """(corpus.jsonl, questions.jsonl) of the embedded data, generated on first use."""
  e = config.embedded
  return corpus.embedded_paths(e.seed, e.num_people, e.questions_per_kind)


def load_tasks(config: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  """The split's questions; task_type is the dataset ("single" / "bridge" / "comparison" for
  the embedded data, e.g. "nq" / "hotpotqa" for user files)."""
  if split not in base.SPLITS:
    raise ValueError(f"search: unknown split {split!r}; known: {base.SPLITS}")
  files = [f for f in config.qa_files[split].split(",") if f.strip()]
  if files:
    questions = data.load_questions(files)
  else:
    everything = corpus.read_jsonl(embedded_data_paths(config)[1])
    n = config.embedded.num_eval
    # valid_seen and valid_unseen are the first 2 x num_eval questions; train the rest.
    questions = {"valid_seen": everything[:n], "valid_unseen": everything[n:2 * n],
                 "train": everything[2 * n:]}[split]
  return [base.Task(env=NAME, task_id=f"search-{split}-{index}", split=split,
                    task_type=q["data_source"], payload=q)
          for index, q in enumerate(questions)]


def make_retriever(config: ml_collections.ConfigDict) -> retrieval.Retriever:
  """The configured retriever; a local BM25 index is built once per process and corpus."""
  if config.retriever == "remote":
    return retrieval.RemoteRetriever(config.retrieval_url)
  if config.retriever != "bm25":
    raise ValueError(f"search: unknown retriever {config.retriever!r} (bm25 or remote)")
  path = config.corpus_path or str(embedded_data_paths(config)[0])
  if path not in _RETRIEVERS:
    _RETRIEVERS[path] = retrieval.BM25Retriever(data.load_corpus(path))
  return _RETRIEVERS[path]


def make_env(config: ml_collections.ConfigDict, with_expert: bool = False) -> SearchEnv:
  """A search env; with the expert, info["expert_action"] searches the gold passages one by
  one and then answers."""
  return SearchEnv(make_retriever(config), topk=config.topk, max_turns=config.max_steps,
                   with_expert=with_expert)


def make_agent_format(config: ml_collections.ConfigDict) -> SearchFormat:
  """The search prompt (whole history) and the `<search>` / `<answer>` parser."""
  del config
  return SearchFormat()

"""Search-QA: parsing, exact match, the embedded data, retrieval (local and over HTTP), the
env protocol and the expert."""

from __future__ import annotations

import http.client
import json
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from seed_jax.envs import base, registry
from seed_jax.envs.agent_format import ParsedAction, Turn
from seed_jax.envs.search import corpus, data, retrieval, serve
from seed_jax.envs.search.env import exact_match, normalize_answer
from seed_jax.envs.search.prompt import parse_search_response

search = registry.get_env_module("search")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("SEED_JAX_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def small_config():
  config = search.default_config()
  config.embedded.num_people = 120
  config.embedded.questions_per_kind = 40
  config.embedded.num_eval = 20
  return config


@pytest.fixture(scope="module")
def small_retriever():
  passages, _ = corpus.generate(seed=0, num_people=120, questions_per_kind=1)
  return retrieval.BM25Retriever(passages)


@pytest.fixture(scope="module")
def server_port(small_retriever):
  """One loopback server on an ephemeral port for the module, stopped at its end."""
  server, _ = serve.serve_in_thread(small_retriever)
  yield server.server_address[1]
  server.shutdown()
  server.server_close()


# ----- parsing -----

@pytest.mark.parametrize("response, action", [
    ("<think>x</think><search> who  founded Foo </search>", "<search>who founded Foo</search>"),
    ("<answer>Paris</answer>", "<answer>Paris</answer>"),
    ("<think>t</think>\n<search>cut by the stop string", "<search>cut by the stop string</search>"),
])
def test_parse_valid_responses(response, action):
  assert parse_search_response(response) == ParsedAction(action, True)


@pytest.mark.parametrize("response", [
    "no tags at all",
    "<search>a</search><answer>b</answer>",  # both kinds
    "<answer>b</answer> or <search>a</search>",
    "<search>a</search><search>b</search>",  # one kind twice
    "<answer>a</answer><answer>a</answer>",
    "<answer>   </answer>",  # empty
    "<answer>北京</answer>",
])
def test_parse_invalid_responses(response):
  parsed = parse_search_response(response)
  assert not parsed.valid and parsed.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<search>", "</search>", "<answer>", "</answer>", "<think>",
                                 "</think>", "x", " ", "\n", "q"]), max_size=12).map("".join)
       | st.text())
def test_parse_never_raises_and_valid_actions_are_single_blocks(response):
  parsed = parse_search_response(response)
  if parsed.valid:
    assert parsed.action.startswith(("<search>", "<answer>"))
    assert response.count("<search>") + response.count("<answer>") == 1


# ----- exact match -----

@pytest.mark.parametrize("prediction, gold, expected", [
    ("The Eiffel Tower", ["eiffel tower"], True),
    ("  paris. ", ["Paris"], True),
    ("an apple", ["Apple", "pear"], True),
    ("Paris, France", ["Paris"], False),
    ("1875", ["1875"], True),
])
def test_exact_match_after_normalisation(prediction, gold, expected):
  assert exact_match(prediction, gold) is expected


def test_normalize_answer_drops_articles_punctuation_and_case():
  assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"


# ----- embedded data -----

def test_embedded_data_is_deterministic_and_in_wiki18_format():
  passages, questions = corpus.generate(seed=3, num_people=60, questions_per_kind=10)
  assert (passages, questions) == corpus.generate(seed=3, num_people=60, questions_per_kind=10)
  titles = [retrieval.split_title(p)[0] for p in passages]
  assert len(set(titles)) == len(titles)  # every title names one entity
  assert all(p["contents"].startswith('"') for p in passages)
  assert {q["data_source"] for q in questions} == {"single", "bridge", "comparison"}
  for q in questions:
    assert set(q["supporting_titles"]) <= set(titles)
    hops = 1 if q["data_source"] == "single" else 2
    assert len(q["supporting_titles"]) == hops


def test_gold_passages_are_retrievable_with_the_expert_queries(small_retriever):
  _, questions = corpus.generate(seed=0, num_people=120, questions_per_kind=20)
  for q in questions:
    for query, title in zip(q["expert_queries"], q["supporting_titles"]):
      top3 = small_retriever.retrieve([query], 3)[0]
      assert title in [retrieval.split_title(d)[0] for d in top3], (query, title)


def test_answers_need_retrieval_not_the_question():
  """The answer never appears in the question, so it cannot be copied from it."""
  _, questions = corpus.generate(seed=0, num_people=120, questions_per_kind=20)
  for q in questions:
    if q["data_source"] != "comparison":  # comparison answers are one of the two names
      assert normalize_answer(q["golden_answers"][0]) not in normalize_answer(q["question"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=3))
def test_bm25_answers_any_query_with_topk_passages(small_retriever, queries):
  results = small_retriever.retrieve(queries, 3)
  assert len(results) == len(queries)
  assert all(len(docs) == 3 for docs in results)


# ----- retrieval server -----

def _post(url_port, body: bytes, path="/retrieve", method="POST", headers=None):
  connection = http.client.HTTPConnection("127.0.0.1", url_port, timeout=10)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"{}")
  finally:
    connection.close()


def test_server_round_trip_matches_local_retrieval(small_retriever):
  server, url = serve.serve_in_thread(small_retriever)
  try:
    remote = retrieval.RemoteRetriever(url, timeout_s=10)
    queries = ["Who founded a glassware company?", "river"]
    assert remote.retrieve(queries, 3) == small_retriever.retrieve(queries, 3)
    port = server.server_address[1]
    status, answer = _post(port, json.dumps({"queries": ["river"], "topk": 2,
                                             "return_scores": True}).encode())
    assert status == 200
    assert [set(item) for item in answer["result"][0]] == [{"document", "score"}] * 2
  finally:
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("body, path, method, status", [
    (b"not json", "/retrieve", "POST", 400),
    (b"[1, 2]", "/retrieve", "POST", 400),
    (b'{"queries": "one string"}', "/retrieve", "POST", 400),
    (b'{"queries": [1]}', "/retrieve", "POST", 400),
    (b'{"queries": ["a"], "topk": 0}', "/retrieve", "POST", 400),
    (b'{"queries": ["a"], "topk": "3"}', "/retrieve", "POST", 400),
    (b'{"queries": ["a"], "return_scores": "yes"}', "/retrieve", "POST", 400),
    (b'\xff\xfe', "/retrieve", "POST", 400),
    (b'{"queries": ["a"]}', "/elsewhere", "POST", 404),
    (b"", "/retrieve", "GET", 405),
])
def test_server_answers_malformed_requests_with_4xx_and_keeps_serving(
    server_port, body, path, method, status):
  got, answer = _post(server_port, body, path, method)
  assert got == status and "error" in answer
  assert _post(server_port, b'{"queries": ["river"]}')[0] == 200  # still alive


def test_server_rejects_oversized_bodies(server_port):
  got, _ = _post(server_port, b"{}", headers={"Content-Length": str(serve.MAX_BODY_BYTES + 1)})
  assert got == 413


def test_serve_command_serves_a_corpus_file_on_loopback(tmp_path: pathlib.Path):
  corpus.write_jsonl(tmp_path / "c.jsonl", [{"id": "0", "contents": '"Zorb"\nZorb is a city.'}])
  process = subprocess.Popen(
      [sys.executable, "-m", "seed_jax.envs.search.serve", f"--corpus={tmp_path / 'c.jsonl'}",
       "--port=0"], stdout=subprocess.PIPE, text=True)
  try:
    banner = process.stdout.readline()  # "serving <path> at http://127.0.0.1:<port>/retrieve"
    url = banner.split(" at ")[-1].strip()
    assert url.startswith("http://127.0.0.1:")
    (docs,) = retrieval.RemoteRetriever(url, timeout_s=10).retrieve(["Zorb"], 3)
    assert docs == [{"id": "0", "contents": '"Zorb"\nZorb is a city.'}]
  finally:
    process.terminate()
    process.wait(timeout=10)


# ----- user data -----

def test_loaders_read_nq_and_hotpotqa_style_files(tmp_path: pathlib.Path):
  nq = tmp_path / "nq_test.jsonl"
  nq.write_text(json.dumps({"id": "1", "question": "who wrote it?",
                            "golden_answers": ["Ann"]}) + "\n")
  hotpot = tmp_path / "hotpotqa_dev.json"
  hotpot.write_text(json.dumps([{"_id": "h", "question": "which is older?", "answer": "B",
                                 "supporting_facts": [["A", 0], ["B", 1], ["A", 2]]}]))
  questions = data.load_questions([str(nq), str(hotpot)])
  assert [q["data_source"] for q in questions] == ["nq", "hotpotqa"]
  assert questions[0]["golden_answers"] == ["Ann"]
  assert questions[1]["expert_queries"] == ["A", "B"]
  search_r1 = {"data_source": "nq", "prompt": [{"role": "user", "content": "... Question: q?"}],
               "reward_model": {"ground_truth": {"target": ["a1", "a2"]}}}
  assert data.normalize_record(search_r1, "x") == {
      "question": "q?", "golden_answers": ["a1", "a2"], "data_source": "nq"}


def test_loaders_read_search_r1_parquet(tmp_path: pathlib.Path):
  pq = pytest.importorskip("pyarrow.parquet")  # optional dependency
  import pyarrow as pa
  rows = [{"data_source": "hotpotqa", "question": "q?",
           "reward_model": {"ground_truth": {"target": ["a"]}}}]
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
  assert data.load_questions([str(tmp_path / "train.parquet")]) == [
      {"question": "q?", "golden_answers": ["a"], "data_source": "hotpotqa"}]


def test_user_files_and_corpus_drive_the_env(tmp_path: pathlib.Path):
  docs = [{"id": "0", "contents": '"Zorb"\nZorb is the capital of Plim.'},
          {"id": "1", "contents": '"Quax"\nQuax is a river.'}]
  corpus.write_jsonl(tmp_path / "corpus.jsonl", docs)
  (tmp_path / "popqa.jsonl").write_text(
      json.dumps({"question": "What is the capital of Plim?", "golden_answers": ["Zorb"]}) + "\n")
  config = search.default_config()
  config.corpus_path = str(tmp_path / "corpus.jsonl")
  config.qa_files.valid_unseen = str(tmp_path / "popqa.jsonl")
  (task,) = search.load_tasks(config, "valid_unseen")
  assert task.task_type == "popqa"
  env = search.make_env(config)
  env.reset(task, seed=0)
  result = env.step("<search>capital of Plim</search>")
  assert "Doc 1(Title: Zorb) Zorb is the capital" in result.observation


# ----- env protocol and expert -----

def test_episode_protocol(small_config):
  env = search.make_env(small_config)
  task = search.load_tasks(small_config, "valid_seen")[0]
  observation, info = env.reset(task, seed=0)
  base.check_info(info, "reset")
  assert observation == info["instruction"] == task.payload["question"]
  result = env.step("just text")
  assert not result.info["action_valid"] and not result.done and result.reward == 0.0
  result = env.step("<search>anything</search>")
  assert result.observation.startswith("<information>Doc 1(Title: ")
  assert result.observation.count("\nDoc ") == 2  # top-3 passages
  assert len(result.info["retrieved_titles"]) == 3
  result = env.step("<search>more</search>")
  result = env.step("<search>last turn</search>")  # the 4th turn ends the episode
  assert result.done and not result.info["won"] and result.reward == 0.0


def test_answer_scores_exact_match(small_config):
  env = search.make_env(small_config)
  task = search.load_tasks(small_config, "valid_seen")[0]
  env.reset(task, seed=0)
  wrong = env.step("<answer>certainly not this</answer>")
  assert wrong.done and wrong.reward == 0.0 and not wrong.info["won"]
  env.reset(task, seed=0)
  right = env.step(f"<answer>the {task.payload['golden_answers'][0].upper()}</answer>")
  assert right.done and right.reward == 1.0 and right.info["won"]


def test_splits_are_disjoint(small_config):
  questions = {split: {t.payload["question"] for t in search.load_tasks(small_config, split)}
               for split in base.SPLITS}
  assert len(questions["valid_seen"]) == len(questions["valid_unseen"]) == 20
  assert not questions["train"] & questions["valid_seen"]
  assert not questions["valid_seen"] & questions["valid_unseen"]


def test_expert_succeeds_on_every_sampled_task_per_dataset(small_config):
  env = search.make_env(small_config, with_expert=True)
  per_source: dict[str, list[bool]] = {}
  for task in search.load_tasks(small_config, "valid_unseen"):
    _, info = env.reset(task, seed=0)
    searches_hit_gold = True
    while True:
      result = env.step(info["expert_action"])
      info = result.info
      if "retrieved_titles" in info:
        gold = set(task.payload["supporting_titles"])
        searches_hit_gold &= bool(set(info["retrieved_titles"]) & gold)
      if result.done:
        break
    per_source.setdefault(task.task_type, []).append(info["won"] and searches_hit_gold)
  assert set(per_source) == {"single", "bridge", "comparison"}
  assert all(all(wins) for wins in per_source.values())


def test_prompt_keeps_the_whole_history():
  agent_format = search.make_agent_format(search.default_config())
  assert agent_format.stop_strings == ("</search>", "</answer>")
  history = [Turn("Q?", "<search>a</search>"), Turn("<information>A</information>",
                                                              "<search>b</search>")]
  prompt = agent_format.render("Q?", history, "<information>B</information>", None, 3)
  assert prompt.index("<search>a</search>") < prompt.index("<information>A</information>") \
      < prompt.index("<search>b</search>") < prompt.index("<information>B</information>")
  assert "Your question: Q?" in prompt and "<answer> </answer>" in prompt
  first = agent_format.render("Q?", [], "Q?", None, 1)
  assert "Prior to this step" not in first

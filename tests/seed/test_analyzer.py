"""Analyzer parsing, retries, the three backends (openai against loopback) and the
analysis files. The prompt builder has its own tests (test_transcript.py)."""

from __future__ import annotations

import http.server
import json
import logging
import threading

import pytest

from seed_jax.seed import analysis_file
from seed_jax.seed import analyzer as an
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.seed.transcript import build_analyzer_prompt

GOOD = {"episode_summary": "Found the apple and cooled it.",
        "episode_skill": "Open the fridge before you try to cool the apple."}


def _traj(won=True, info=None):
  steps = [StepRecord([1], [2], [-0.1], True, observation="You are in a kitchen.",
                      response_text="<think>look</think><action>go to fridge 1</action>"),
           StepRecord([1], [2], [-0.1], False, observation="Nothing happens.",
                      response_text="cool apple")]
  return Trajectory(task_id="t", group_id="t", traj_id="0", won=won,
                    episode_reward=10.0 * won, steps=steps,
                    task="cool some apple and put it in countertop", info=info or {})


@pytest.mark.parametrize("text,ok", [
    (json.dumps(GOOD), True),
    ("```json\n" + json.dumps(GOOD) + "\n```", True),
    ("<think>{\"episode_skill\": 1}</think> Sure: " + json.dumps(GOOD) + " done", True),
    ('{"episode_summary": "x", "episode_skill": "too few words"}', False),
    ('{"episode_summary": "x", "episode_skill": "Open the fridge before you', False),  # truncated
    ("I think you should open the fridge first.", False),
    ('{"episode_skill": "Open the fridge before you cool it."}', False),  # no summary
    ('["episode_summary", "episode_skill"]', False),
    ("", False),
])
def test_parse_answer(text, ok):
  got = an.parse_answer(text)
  assert (got is not None) == ok
  if ok:
    assert got == an.Analysis(GOOD["episode_summary"], GOOD["episode_skill"])


@pytest.mark.parametrize("text,reason", [
    ("", "empty answer"),
    ("I think you should open the fridge first.", "no JSON object"),
    ('{"episode_skill": "Open the fridge before you cool it."}', "no string episode_summary"),
    ('{"episode_summary": "x", "episode_skill": 3}', "no string episode_skill"),
    ('{"episode_summary": "x", "episode_skill": "too few words"}',
     "episode_skill under 5 words"),
])
def test_a_rejected_answer_says_why(text, reason):
  assert an.parse_answer_with_reason(text) == (None, reason)
  assert an.parse_answer_with_reason(json.dumps(GOOD))[1] == ""


class _ScriptedPolicy:
  """A generate_fn answering from a script, recording each call's decoding."""

  def __init__(self, script):
    self.script, self.calls = script, []

  def __call__(self, prompt_ids, *, temperature, seed):
    self.calls.append({"prompts": len(prompt_ids), "temperature": temperature, "seed": seed,
                       "ids": prompt_ids})
    return self.script[len(self.calls) - 1]


def test_policy_backend_retries_only_malformed_answers_and_counts_the_rest(tokenizer):
  generate = _ScriptedPolicy(
      [["not json", json.dumps(GOOD), '{"episode_summary": "a", "episode_skill": "x'],
       ["still not json", json.dumps(GOOD)], ["nope"]])
  trajs = [_traj(), _traj(won=False), _traj()]
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="policy"), generate,
                              tokenizer=tokenizer, max_prompt_tokens=2048)
  stats = analyzer.annotate(trajs, seed=5)
  assert [c["prompts"] for c in generate.calls] == [3, 2, 1]  # two retries, failed ones only
  # Still malformed after the retries: no skill, counted invalid, no exception.
  assert [t.skill for t in trajs] == [None, GOOD["episode_skill"], GOOD["episode_skill"]]
  # Every answer's tokens count, retries included: what the analysis phase decodes.
  answers = [answer for call in generate.script for answer in call]
  assert stats == {"requests": 6, "retries": 3, "valid": 2, "invalid": 1, "truncated": 0,
                   "answer_tokens": sum(len(tokenizer.encode(a)) for a in answers)}
  # The policy decodes the builder's chat-template ids.
  assert generate.calls[0]["ids"][0] == build_analyzer_prompt(trajs[0], tokenizer, 2048).ids


def test_a_retry_samples_with_a_new_seed_instead_of_repeating_the_greedy_answer(tokenizer):
  generate = _ScriptedPolicy([["not json"], ["not json"], ["not json"]])
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="policy", temperature=0.0),
                              generate, tokenizer=tokenizer, max_prompt_tokens=2048)
  reports, stats = analyzer.analyze([_traj()], seed=11)
  first, *retries = generate.calls
  assert first["temperature"] == 0.0 and first["seed"] == 11
  assert [c["temperature"] for c in retries] == [0.7, 0.7]
  assert len({c["seed"] for c in generate.calls}) == 3  # every attempt its own seed
  assert reports[0].skill is None and reports[0].attempts == 3
  assert reports[0].raw == "not json" and reports[0].reason == "no JSON object"
  assert stats["invalid"] == 1 and stats["retries"] == 2
  # Same seed, same calls: reproducible.
  again = _ScriptedPolicy([["not json"]] * 3)
  an.make_analyzer(an.AnalyzerConfig(backend="policy"), again, tokenizer=tokenizer,
                   max_prompt_tokens=2048).analyze([_traj()], seed=11)
  assert [c["seed"] for c in again.calls] == [c["seed"] for c in generate.calls]


def test_greedy_retries_are_refused_and_none_can_be_asked_for():
  with pytest.raises(ValueError, match="retry_temperature"):
    an.AnalyzerConfig(retry_temperature=0.0)
  with pytest.raises(ValueError, match="max_retries"):
    an.AnalyzerConfig(max_retries=-1)
  calls = []
  analyzer = an.Analyzer(an.AnalyzerConfig(backend="oracle", max_retries=0),
                         lambda prompts, trajs, decoding: calls.append(decoding) or ["bad"])
  _, stats = analyzer.analyze([_traj()])
  assert len(calls) == 1 and stats["invalid"] == 1 and stats["retries"] == 0


def test_truncated_transcripts_are_counted(tokenizer):
  long_traj = _traj()
  long_traj.steps = long_traj.steps * 30
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="oracle"), tokenizer=tokenizer,
                              max_prompt_tokens=512)
  reports, stats = analyzer.analyze([long_traj, _traj()])
  assert stats["truncated"] == 1
  assert reports[0].prompt.truncated and len(reports[0].prompt.ids) <= 512
  assert not reports[1].prompt.truncated


def test_the_policy_backend_needs_the_sampler_and_the_tokenizer(tokenizer):
  with pytest.raises(ValueError, match="generate_fn"):
    an.make_analyzer(an.AnalyzerConfig(backend="policy"))
  with pytest.raises(ValueError, match="tokenizer"):
    an.make_analyzer(an.AnalyzerConfig(backend="policy"), _ScriptedPolicy([]))
  with pytest.raises(ValueError, match="backend"):
    an.make_analyzer(an.AnalyzerConfig(backend="gpt"))


def test_oracle_backend_turns_privileged_info_into_valid_skills():
  info = {"goal": "put a cool apple in countertop", "task_type": "pick_cool_then_place",
          "expert_plan": ["go to fridge 1", "cool apple 1 with fridge 1"]}
  trajs = [_traj(won=True, info=info), _traj(won=False, info=info), _traj(won=False)]
  reports, stats = an.make_analyzer(an.AnalyzerConfig(backend="oracle")).analyze(trajs)
  assert stats["valid"] == 3 and stats["retries"] == 0
  assert "step 1: go to fridge 1, step 2: cool apple 1 with fridge 1" in reports[0].skill
  assert "Do not wander" in reports[1].skill


SECRET = "sk-test-DO-NOT-LEAK-123"


class _Handler(http.server.BaseHTTPRequestHandler):
  """Answers from the server's script: a status code and a body per request."""

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    self.server.seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                             "body": body})
    status, content = self.server.script.pop(0)
    payload = (json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]})
               if status == 200 else "overloaded").encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(payload)))
    self.end_headers()
    self.wfile.write(payload)

  def log_message(self, *args):  # keep the test output clean
    pass


@pytest.fixture
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  srv.seen, srv.script = [], []
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                            daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()
  thread.join(timeout=5)


def test_openai_backend_against_loopback(server, monkeypatch, caplog):
  monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", SECRET)
  caplog.set_level(logging.DEBUG)
  # Request 1: a 503 (retried by HTTP), then non-JSON (re-asked), then a valid answer.
  server.script = [(503, None), (200, "I would rather chat."), (200, json.dumps(GOOD))]
  cfg = an.AnalyzerConfig(
      backend="openai", base_url=f"http://127.0.0.1:{server.server_port}/v1/", model="judge",
      api_key_env="SEED_TEST_ANALYZER_KEY", timeout_s=5.0, http_retries=2,
      retry_backoff_s=0.01, concurrency=1)
  traj = _traj()
  stats = an.make_analyzer(cfg).annotate([traj])
  assert traj.skill == GOOD["episode_skill"]
  assert stats == {"requests": 2, "retries": 1, "valid": 1, "invalid": 0, "truncated": 0}
  assert [s["path"] for s in server.seen] == ["/v1/chat/completions"] * 3
  assert all(s["auth"] == f"Bearer {SECRET}" for s in server.seen)
  body = server.seen[0]["body"]
  assert body["model"] == "judge" and body["temperature"] == 0.0
  assert body["messages"][0]["content"] == build_analyzer_prompt(traj, None, None).text
  # The re-ask after the non-JSON answer samples.
  assert server.seen[2]["body"]["temperature"] == 0.7
  assert "HTTP 503" in caplog.text
  assert SECRET not in caplog.text

  # Every attempt failing: the trajectory is counted invalid, no exception, no key leaked.
  server.script = [(500, None)] * 9
  traj = _traj()
  stats = an.make_analyzer(cfg).annotate([traj])
  assert traj.skill is None and stats["invalid"] == 1
  assert SECRET not in caplog.text


def test_openai_backend_needs_the_key_variable(monkeypatch):
  monkeypatch.delenv("SEED_TEST_MISSING_KEY", raising=False)
  with pytest.raises(ValueError, match="SEED_TEST_MISSING_KEY"):
    an.make_analyzer(an.AnalyzerConfig(backend="openai", api_key_env="SEED_TEST_MISSING_KEY"))


def test_openai_backend_unreachable_is_bounded(monkeypatch):
  monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", SECRET)
  # A port nobody listens on: connection refused, retried, then no skill.
  import socket
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  port = sock.getsockname()[1]
  sock.close()
  cfg = an.AnalyzerConfig(backend="openai", base_url=f"http://127.0.0.1:{port}",
                          api_key_env="SEED_TEST_ANALYZER_KEY", timeout_s=1.0,
                          http_retries=1, retry_backoff_s=0.01, max_retries=0)
  reports, stats = an.make_analyzer(cfg).analyze([_traj()])
  assert reports[0].analysis is None and reports[0].reason == "empty answer"
  assert stats["invalid"] == 1


# -- group hindsight ---------------------------------------------------------------------

def test_group_hindsight_gives_a_failure_the_skill_of_its_groups_shortest_win():
  # group a: fail, win in 5, win in 3 (the shorter), fail -> both failures read index 2
  # group b: only failures -> each its own; group c: its win wrote no skill -> its own
  groups = ["a", "a", "a", "a", "b", "b", "c", "c"]
  won = [False, True, True, False, False, False, True, False]
  steps = [6, 5, 3, 6, 6, 6, 2, 6]
  skilled = [True, True, True, False, True, True, False, True]
  assert an.group_hindsight_sources(groups, won, steps, skilled) == [2, 1, 2, 2, 4, 5, 6, 7]
  # ties between wins go to the first; a win always keeps its own skill
  assert an.group_hindsight_sources(["g"] * 3, [True, True, False], [3, 3, 6],
                                    [True, True, True]) == [0, 1, 0]


def _report(skill):
  prompt = build_analyzer_prompt(_traj(), None, None)
  analysis = an.Analysis("summary", skill) if skill else None
  return an.AnalysisReport(prompt, "raw", analysis, "" if skill else "no JSON object", 1)


def test_assign_skills_sets_own_skills_or_under_group_hindsight_a_won_siblings():
  def group():
    trajs = [_traj(won=False), _traj(won=True), _traj(won=False)]
    for i, traj in enumerate(trajs):
      traj.traj_id = f"g:{i}"
    return trajs
  reports = [_report("wander less and look around first"),
             _report("go to the fridge then cool the apple"), _report(None)]
  own = group()
  assert an.assign_skills(own, reports) == 0
  assert [t.skill for t in own] == [r.skill for r in reports]
  assert [t.skill_from for t in own] == [None, None, None]
  shared = group()
  assert an.assign_skills(shared, reports, group_hindsight=True) == 2
  assert [t.skill for t in shared] == [reports[1].skill] * 3
  assert [t.skill_from for t in shared] == ["g:1", None, "g:1"]
  with pytest.raises(ValueError, match="2 reports for 3 trajectories"):
    an.assign_skills(shared, reports[:2])


# -- analysis files ----------------------------------------------------------------------

def test_each_iteration_writes_one_line_per_trajectory_with_its_skill_or_why_not(
    tmp_path, tokenizer):
  generate = _ScriptedPolicy([[json.dumps(GOOD), "Sure, here you go."], ["still no"]])
  trajs = [_traj(info={"task_type": "pick_cool_then_place"}), _traj(won=False)]
  trajs[1].traj_id = "1"
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="policy", max_retries=1), generate,
                              tokenizer=tokenizer, max_prompt_tokens=2048)
  reports, _ = analyzer.analyze(trajs)
  gates = [{"gate_mean": 0.6, "delta_mean": 0.1}, None]
  path = analysis_file.write_analysis_file(str(tmp_path), 3, trajs, reports, gates)
  assert path == str(tmp_path / "analysis" / "iter_3.jsonl")
  lines = [json.loads(line) for line in open(path)]
  assert [line["traj_id"] for line in lines] == ["0", "1"]
  good, bad = lines
  assert good == {
      "iteration": 3, "traj_id": "0", "group_id": "t", "task_id": "t",
      "task_type": "pick_cool_then_place", "task": "cool some apple and put it in countertop",
      "won": True, "reward": 10.0, "num_steps": 2, "invalid_steps": 1,
      "ineffective_steps": 0, "analyzer_output": json.dumps(GOOD), "attempts": 1,
      "summary": GOOD["episode_summary"], "skill": GOOD["episode_skill"], "skill_error": None,
      "skill_from": None, "truncated": False, "omitted_steps": 0,
      "gate": {"gate_mean": 0.6, "delta_mean": 0.1}}
  assert bad["skill"] is None and bad["skill_error"] == "no JSON object"
  assert bad["analyzer_output"] == "still no" and bad["attempts"] == 2 and bad["gate"] is None
  assert not list((tmp_path / "analysis").glob("*.tmp"))

  # Library skills (no analyzer): the skill is the trajectory's, the analyzer fields null.
  trajs[0].skill, trajs[1].skill = "Always open the fridge before cooling.", None
  path = analysis_file.write_analysis_file(str(tmp_path), 4, trajs)
  lib, missing = [json.loads(line) for line in open(path)]
  assert lib["skill"] == trajs[0].skill and lib["analyzer_output"] is None
  assert lib["skill_error"] is None and missing["skill_error"] == "no skill for this task type"
  with pytest.raises(ValueError, match="2 trajectories"):
    analysis_file.write_analysis_file(str(tmp_path), 5, trajs, reports[:1])


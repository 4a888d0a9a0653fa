"""Analyzer prompt, parsing, retries and the three backends (openai against loopback)."""

from __future__ import annotations

import http.server
import json
import logging
import threading

import pytest

from seed_jax.seed import analyzer as an
from seed_jax.seed.batch import StepRecord, Trajectory

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


def test_prompt_holds_task_outcome_and_steps():
  prompt = an.build_prompt(_traj(won=False))
  for part in ("Task: cool some apple and put it in countertop", "Outcome: FAILURE",
               "Step 1", "Observation: You are in a kitchen.",
               "Response: <think>look</think><action>go to fridge 1</action>",
               "Action valid: true", "Step 2", "Action valid: false", "core mistake",
               '"episode_skill"'):
    assert part in prompt, part
  assert "Outcome: SUCCESS" in an.build_prompt(_traj(won=True))
  short = an.build_prompt(_traj(), max_observation_chars=5)
  assert "Observation: You a ..." in short


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


def test_policy_backend_retries_only_malformed_answers():
  calls = []
  script = [["not json", json.dumps(GOOD), '{"episode_summary": "a", "episode_skill": "x'],
            ["still not json", json.dumps(GOOD)], ["nope"]]

  def generate(prompts):
    calls.append(len(prompts))
    return script[len(calls) - 1]

  trajs = [_traj(), _traj(won=False), _traj()]
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="policy"), generate_fn=generate)
  stats = analyzer.annotate(trajs)
  assert calls == [3, 2, 1]  # two retries at most, only for the failed ones
  assert [t.skill for t in trajs] == [None, GOOD["episode_skill"], GOOD["episode_skill"]]
  assert stats == {"requests": 6, "retries": 3, "valid": 2, "invalid": 1}
  with pytest.raises(ValueError, match="generate_fn"):
    an.make_analyzer(an.AnalyzerConfig(backend="policy"))
  with pytest.raises(ValueError, match="backend"):
    an.make_analyzer(an.AnalyzerConfig(backend="gpt"))


def test_oracle_backend_turns_privileged_info_into_valid_skills():
  info = {"goal": "put a cool apple in countertop", "task_type": "pick_cool_then_place",
          "expert_plan": ["go to fridge 1", "cool apple 1 with fridge 1"]}
  trajs = [_traj(won=True, info=info), _traj(won=False, info=info), _traj(won=False)]
  results, stats = an.make_analyzer(an.AnalyzerConfig(backend="oracle")).analyze(trajs)
  assert stats["valid"] == 3 and stats["retries"] == 0
  assert "go to fridge 1, then cool apple 1 with fridge 1" in results[0].skill
  assert "Do not wander" in results[1].skill


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
  assert stats == {"requests": 2, "retries": 1, "valid": 1, "invalid": 0}
  assert [s["path"] for s in server.seen] == ["/v1/chat/completions"] * 3
  assert all(s["auth"] == f"Bearer {SECRET}" for s in server.seen)
  body = server.seen[0]["body"]
  assert body["model"] == "judge" and body["temperature"] == 0.0
  assert body["messages"][0]["content"] == an.build_prompt(traj)
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
  results, stats = an.make_analyzer(cfg).analyze([_traj()])
  assert results == [None] and stats["invalid"] == 1

"""Host-side helpers: output from the primary host only, and SIGTERM as a stop request.

(Several real processes: tests/train/test_multihost.py.)
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from seed_jax.parallel import hosts


@pytest.fixture
def secondary_host(monkeypatch):
  """Makes this process look like a host other than the primary."""
  monkeypatch.setattr(hosts, "is_primary", lambda: False)


def test_only_the_primary_host_prints_and_draws_progress_bars(capsys, secondary_host):
  hosts.print0("[iter 1/1] success 0.500")
  bar = hosts.progress(range(3), desc="update")
  assert list(bar) == [0, 1, 2]  # every host still iterates
  assert bar.disable and hosts.progress(range(3), disable=True).disable
  assert hosts.primary_label("iter 1 rollout") is None
  captured = capsys.readouterr()
  assert captured.out == "" and captured.err == ""


def test_the_primary_host_prints_and_draws_progress_bars(capsys):
  hosts.print0("[iter 1/1] success 0.500")
  assert capsys.readouterr().out == "[iter 1/1] success 0.500\n"
  assert not hosts.progress(range(3)).disable
  assert hosts.progress(range(3), disable=True).disable
  assert hosts.primary_label("iter 1 rollout") == "iter 1 rollout"


def test_sigterm_becomes_a_stop_request_and_the_handler_is_restored():
  before = signal.getsignal(signal.SIGTERM)
  with hosts.PreemptionGuard() as guard:
    assert not guard.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)  # the process is not terminated
    assert guard.should_stop() and guard.received == signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigterm_is_not_held_back():
  seen = []
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
  try:
    with hosts.PreemptionGuard() as guard:
      os.kill(os.getpid(), signal.SIGTERM)
      assert seen == [] and guard.should_stop()
      os.kill(os.getpid(), signal.SIGTERM)  # goes to the handler from before the guard
      assert seen == [signal.SIGTERM]
  finally:
    signal.signal(signal.SIGTERM, previous)


def test_every_host_stops_when_any_host_was_signalled():
  """`agree` stands for the all-gather over hosts: another host's SIGTERM stops this one
  at the same point, although this one received nothing."""
  asked = []

  def another_host_was_signalled(local_flag: bool) -> bool:
    asked.append(local_flag)
    return True

  with hosts.PreemptionGuard(agree=another_host_was_signalled) as guard:
    assert guard.should_stop() and guard.received is None and asked == [False]
  assert hosts.any_host(False) is False and hosts.any_host(True) is True  # one process


def test_outside_the_main_thread_the_guard_installs_nothing():
  before, results = signal.getsignal(signal.SIGTERM), []

  def in_a_thread():
    with hosts.PreemptionGuard() as guard:
      results.append((signal.getsignal(signal.SIGTERM), guard.should_stop()))

  thread = threading.Thread(target=in_a_thread)
  thread.start()
  thread.join()
  assert results == [(before, False)]

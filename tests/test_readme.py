"""The README's Quickstart holds exactly the two commands, and CI runs the second."""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
  text = (REPO / "README.md").read_text()
  section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]


def test_quickstart_has_two_single_line_commands():
  commands = quickstart_commands()
  assert len(commands) == 2
  assert all("\n" not in c for c in commands)
  assert "seed_jax.main --config=configs/alfworld.py" in commands[0]
  assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
  ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
  assert ci[-1] == quickstart_commands()[1]


def test_every_file_the_readme_names_exists():
  text = (REPO / "README.md").read_text()
  for path in set(re.findall(r"`((?:configs|launch|bench|seed_jax)/[\w/.]+\.(?:py|sh))`", text)):
    assert (REPO / path).exists(), path

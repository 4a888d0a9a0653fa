"""ALFWorld game problems built from the AI2-THOR floor plans that the alfworld package ships.

A floor plan gives the object types present (`FloorPlan*-objects.json`), the poses of most
receptacles (`-openable.json`) and the agent's reachable cells (`-layout.npy`). `sample_game`
turns one floor plan and one task type into a PDDL problem in ALFWorld's own vocabulary
(mangled AI2-THOR ids, `loc|x|z|rotation|horizon` locations, the facts official games use),
so the real engine, grammar and experts play it unchanged. Solvability is checked elsewhere
by playing the expert (see `generator.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from pathlib import Path

import numpy as np

# Room types by floor-plan number, as ALFRED numbers them.
ROOM_RANGES = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231),
               "Bedroom": range(301, 331), "Bathroom": range(401, 431)}
# valid_unseen uses the floor plans ALFWorld holds out (a kitchen, a living room, a bedroom
# with a desk lamp, a bathroom); train and valid_seen use all the others.
HELD_OUT_FLOOR_PLANS = (10, 219, 308, 424)
_OPENABLE = frozenset(("Fridge", "Cabinet", "Microwave", "Drawer", "Safe", "Box"))
_RECEPTACLE_OBJECTS = frozenset(("Bowl", "Box", "Cup", "Mug", "Plate", "Pan", "Pot"))
# ALFRED never asks to put the object back into the appliance that changed its state.
_FORBIDDEN_PARENTS = {"pick_clean_then_place_in_recep": {"SinkBasin", "BathtubBasin"},
                      "pick_heat_then_place_in_recep": {"Microwave"},
                      "pick_cool_then_place_in_recep": {"Fridge"}}
_REQUIRED_APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin",
                       "pick_heat_then_place_in_recep": "Microwave",
                       "pick_cool_then_place_in_recep": "Fridge"}
_STATE_PROPERTY = {"pick_clean_then_place_in_recep": "Cleanable",
                   "pick_heat_then_place_in_recep": "Heatable",
                   "pick_cool_then_place_in_recep": "Coolable"}
_LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "TVStand")


def room_type(floor_plan: int) -> str:
  for room, numbers in ROOM_RANGES.items():
    if floor_plan in numbers:
      return room
  raise ValueError(f"FloorPlan{floor_plan} is not an ALFRED floor plan")


def mangle(thor_id: str) -> str:
  """AI2-THOR id -> ALFWorld PDDL name ("Apple|+00.12|..." -> "Apple_bar__plus_00_dot_12...")."""
  name = thor_id.replace("-", "_minus_")
  for char, word in (("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
    name = name.replace(char, word)
  return name


def location_name(x: float, z: float, rotation: float, horizon: float) -> str:
  """A pose (metres, degrees) as an ALFWorld location: x, z in quarter metres, rotation / 90."""
  return mangle(f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{round(rotation / 90) % 4}|{round(horizon)}")


@functools.lru_cache(maxsize=1)
def _constants():
  import alfworld.gen.constants as constants  # pylint: disable=g-import-not-at-top
  return constants


@functools.lru_cache(maxsize=None)
def pickupable_types() -> frozenset[str]:
  """Object types some receptacle can hold (sliced variants left out, as ALFWorld does)."""
  held = set().union(*_constants().VAL_RECEPTACLE_OBJECTS.values())
  return frozenset(t for t in held if "Sliced" not in t)


@functools.lru_cache(maxsize=None)
def static_receptacle_types() -> frozenset[str]:
  c = _constants()
  return frozenset(set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES))


def can_contain(receptacle_type: str, object_type: str) -> bool:
  return object_type in _constants().VAL_RECEPTACLE_OBJECTS.get(receptacle_type, ())


@dataclasses.dataclass(frozen=True)
class FloorPlan:
  number: int
  room: str
  object_types: frozenset[str]
  receptacle_poses: dict[str, tuple[float, float, float, float]]  # THOR id -> x, z, rot, horizon
  reachable: np.ndarray  # [N, 2] x, z in metres


@functools.lru_cache(maxsize=None)
def load_floor_plan(number: int) -> FloorPlan:
  layouts = Path(_constants().__file__).parent / "layouts"
  objects = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
  poses = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
  reachable = np.load(layouts / f"FloorPlan{number}-layout.npy")
  return FloorPlan(number, room_type(number), frozenset(objects),
                   {k: tuple(v) for k, v in poses.items()}, reachable)


def floor_plans_for(task_type: str, held_out: bool) -> list[int]:
  """Floor plans whose room suits the task type (ALFRED's GOALS_VALID), from one pool."""
  rooms = _constants().GOALS_VALID[task_type]
  plans = [n for room in sorted(rooms) for n in ROOM_RANGES[room]]
  plans = [n for n in plans if (n in HELD_OUT_FLOOR_PLANS) == held_out]
  if task_type == "look_at_obj_in_light":
    plans = [n for n in plans if "DeskLamp" in load_floor_plan(n).object_types]
  return plans


@dataclasses.dataclass
class GameSpec:
  """A sampled game: its ALFWorld task parameters and the PDDL problem text."""

  task_type: str  # ALFWorld's long name, e.g. "pick_heat_then_place_in_recep"
  floor_plan: int
  object_target: str
  parent_target: str
  toggle_target: str
  task_sentence: str
  problem: str

  @property
  def folder_name(self) -> str:
    second = self.toggle_target or self.parent_target
    return f"{self.task_type}-{self.object_target}-None-{second}-{self.floor_plan}"

  def traj_data(self, task_id: str, extra: dict) -> dict:
    return {
        "task_id": task_id,
        "task_type": self.task_type,
        "pddl_params": {"object_target": self.object_target, "parent_target": self.parent_target,
                        "toggle_target": self.toggle_target, "mrecep_target": "",
                        "object_sliced": False},
        "scene": {"floor_plan": f"FloorPlan{self.floor_plan}", "scene_num": self.floor_plan},
        "generator": extra,
    }


def _thor_id(type_name: str, x: float, y: float, z: float, suffix: str = "") -> str:
  return f"{type_name}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}" + (f"|{suffix}" if suffix else "")


def _receptacles(plan: FloorPlan, rng: random.Random) -> dict[str, tuple[str, str, tuple]]:
  """THOR id -> (type, location, (x, z)) for the plan's listed plus missing receptacles."""
  static = static_receptacle_types()
  result = {}
  for thor_id, (x, z, rotation, horizon) in sorted(plan.receptacle_poses.items()):
    head, tail = thor_id.split("|", 1)[0], thor_id.rsplit("|", 1)[-1]
    rtype = tail if tail.endswith("Basin") else head
    if rtype.endswith("Basin") and not rtype.startswith(head):
      continue  # e.g. a "Bathtub|...|SinkBasin": its shown name would not match its type
    if rtype in static:
      result[thor_id] = (rtype, location_name(x, z, rotation, horizon), (x, z))
  # About a quarter of the receptacles (stove burners, toasters, coffee machines, garbage
  # cans, towel holders, ...) have no pose in openable.json: place them on free cells.
  present = {rtype for rtype, _, _ in result.values()}
  used_cells = {cell for _, _, cell in result.values()}
  free_cells = [tuple(p) for p in plan.reachable.tolist() if tuple(p) not in used_cells]
  rng.shuffle(free_cells)
  for rtype in sorted((plan.object_types & static) - present):
    for _ in range(2 if rtype == "StoveBurner" else 1):
      if not free_cells:
        break
      x, z = free_cells.pop()
      head, suffix = {"SinkBasin": ("Sink", "SinkBasin"),
                      "BathtubBasin": ("Bathtub", "BathtubBasin")}.get(rtype, (rtype, ""))
      thor_id = _thor_id(head, x + rng.uniform(-0.2, 0.2), rng.uniform(0.0, 1.5),
                         z + rng.uniform(-0.2, 0.2), suffix)
      result[thor_id] = (rtype, location_name(x, z, rng.randrange(4) * 90, 30), (x, z))
  return result


def sample_game(plan: FloorPlan, task_type: str, rng: random.Random) -> GameSpec | None:
  """One random game of `task_type` in `plan`, or None when the plan cannot host it."""
  c = _constants()
  receptacles = _receptacles(plan, rng)
  rtypes = {rtype for rtype, _, _ in receptacles.values()}
  appliance = _REQUIRED_APPLIANCE.get(task_type)
  if appliance and appliance not in rtypes:
    return None
  movable = sorted(t for t in plan.object_types & pickupable_types()
                   if any(can_contain(r, t) for r in rtypes))
  targets = movable
  if task_type in _STATE_PROPERTY:
    targets = [t for t in movable if t in c.VAL_ACTION_OBJECTS[_STATE_PROPERTY[task_type]]]
  rng.shuffle(targets)
  for target in targets:
    hosts = sorted(r for r in rtypes if can_contain(r, target))
    if task_type == "look_at_obj_in_light":
      parent = ""
    else:
      parents = [r for r in hosts if r not in _FORBIDDEN_PARENTS.get(task_type, ())]
      parents = [p for p in parents if any(h != p for h in hosts)]  # target must start elsewhere
      if not parents:
        continue
      parent = rng.choice(parents)
    lamp_host = None
    if task_type == "look_at_obj_in_light":
      lamp_host = _choose_lamp_host(receptacles, rng)
      if lamp_host is None:
        return None
    return _build(plan, task_type, target, parent, lamp_host, receptacles, movable, rng)
  return None


def _choose_lamp_host(receptacles, rng: random.Random) -> str | None:
  # The expert crashes when the lamp's host is openable or shares its location.
  location_count: dict[str, int] = {}
  for _, location, _ in receptacles.values():
    location_count[location] = location_count.get(location, 0) + 1
  candidates = [i for i, (rtype, location, _) in receptacles.items()
                if rtype not in _OPENABLE and location_count[location] == 1]
  preferred = [i for i in candidates if receptacles[i][0] in _LAMP_HOSTS]
  pool = preferred or candidates
  return rng.choice(pool) if pool else None


def _build(plan, task_type, target, parent, lamp_host, receptacles, movable, rng) -> GameSpec:
  c = _constants()
  objects: list[tuple[str, str, str]] = []  # (THOR id, type, receptacle THOR id)
  for otype in movable:
    low, high = (2, 3) if otype == target and task_type == "pick_two_obj_and_place" else (1, 2)
    allowed = [i for i, (rtype, _, _) in receptacles.items()
               if can_contain(rtype, otype) and not (otype == target and rtype == parent)]
    for _ in range(rng.randint(low, high)):
      host = rng.choice(allowed)
      x, z = receptacles[host][2]
      objects.append((_thor_id(otype, x + rng.uniform(-0.4, 0.4), rng.uniform(0.0, 2.0),
                               z + rng.uniform(-0.4, 0.4)), otype, host))
  if lamp_host is not None:
    x, z = receptacles[lamp_host][2]
    objects.append((_thor_id("DeskLamp", x, rng.uniform(0.5, 1.5), z), "DeskLamp", lamp_host))

  # The agent must not start at a receptacle's location (the intro text would change).
  occupied = {cell for _, _, cell in receptacles.values()}
  starts = [tuple(p) for p in plan.reachable.tolist() if tuple(p) not in occupied]
  start_x, start_z = rng.choice(starts)
  start = location_name(start_x, start_z, rng.randrange(4) * 90, 30)

  locations = sorted({location for _, location, _ in receptacles.values()} | {start})
  rtypes = sorted({rtype for rtype, _, _ in receptacles.values()})
  otypes = sorted({otype for _, otype, _ in objects})
  facts = [f"(atLocation agent1 {start})"]
  for thor_id, (rtype, location, _) in sorted(receptacles.items()):
    name = mangle(thor_id)
    facts += [f"(receptacleType {name} {rtype}Type)", f"(receptacleAtLocation {name} {location})"]
    if rtype in _OPENABLE:
      facts.append(f"(openable {name})")
  actions = c.VAL_ACTION_OBJECTS
  for thor_id, otype, host in sorted(objects):
    name = mangle(thor_id)
    facts += [f"(objectType {name} {otype}Type)", f"(inReceptacle {name} {mangle(host)})",
              f"(objectAtLocation {name} {receptacles[host][1]})"]
    if otype == "DeskLamp":
      facts.append(f"(toggleable {name})")
      continue
    facts.append(f"(pickupable {name})")
    for prop, predicate in (("Cleanable", "cleanable"), ("Heatable", "heatable"),
                            ("Coolable", "coolable"), ("Sliceable", "sliceable")):
      if otype in actions[prop]:
        facts.append(f"({predicate} {name})")
    if otype in _RECEPTACLE_OBJECTS:
      facts.append(f"(isReceptacleObject {name})")
  facts += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if can_contain(r, o)]

  import alfworld.gen.goal_library as goal_library  # pylint: disable=g-import-not-at-top
  toggle = "DeskLamp" if lamp_host is not None else ""
  goal = goal_library.gdict[task_type]["pddl"].format(obj=target, recep=parent, toggle=toggle)
  template = rng.choice(goal_library.gdict[task_type]["templates"])
  sentence = template.format(obj=target.lower(), recep=parent.lower(), toggle=toggle.lower())
  declarations = (["agent1 - agent"] + [f"{t}Type - otype" for t in otypes]
                  + [f"{t}Type - rtype" for t in rtypes]
                  + [f"{mangle(i)} - object" for i, _, _ in sorted(objects)]
                  + [f"{mangle(i)} - receptacle" for i in sorted(receptacles)]
                  + [f"{loc} - location" for loc in locations])
  problem = ("(define (problem plan_seed_jax)\n(:domain alfred)\n(:objects\n  "
             + "\n  ".join(declarations) + "\n)\n(:init\n  " + "\n  ".join(facts) + "\n)\n"
             + goal.replace("#", "-") + "\n")
  return GameSpec(task_type, plan.number, target, parent, toggle, sentence, problem)

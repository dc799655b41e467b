"""The analytical planner of seed 001 (``lowbw plan``). Being written."""


def plan(**inputs) -> dict:
  raise NotImplementedError("lowbw.network.plan is being written")

"""``lowbw plan``: the analytical planner. Being written."""


def add_parser(subparsers) -> None:
  del subparsers

"""Golden trajectories of the second half of the registered strategies
(``test_golden.py`` describes them, checks the registry and the first half;
two modules so that ``--dist loadfile`` spreads them over both processes).

Regenerate only on purpose, saying why in the commit message:
``LOWBW_REGENERATE_GOLDEN=1 python -m pytest -q -n 0 tests/test_golden*.py``.
"""

import pytest

import lowbw
from golden import trajectories as golden

# The other half of the registry (test_golden.py checks the first).
STRATEGIES = list(lowbw.strategies.SPECS)[1::2]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_golden_trajectory(strategy):
  golden.check(strategy)

"""The start-up clock of a run's summary: the process's age, to 10 ms."""

import json
import subprocess
import sys

import pytest

from lowbw import telemetry

_CHILD = """
import json, time
time.sleep(0.6)  # before lowbw: part of what import_s counts
import lowbw
from lowbw import telemetry
start, age = time.perf_counter(), telemetry.process_age_s()
time.sleep(0.3)
print(json.dumps({"import_s": telemetry.import_s(), "age": age,
                  "later": telemetry.process_age_s(),
                  "slept": time.perf_counter() - start}))
"""


@pytest.mark.skipif(telemetry.process_age_s() is None, reason="needs /proc")
def test_the_process_age_counts_from_the_process_start():
  out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True,
                       text=True, check=True, timeout=120).stdout
  got = json.loads(out.splitlines()[-1])
  assert 0.6 <= got["import_s"] <= got["age"]
  assert got["later"] - got["age"] == pytest.approx(got["slept"], abs=0.03)

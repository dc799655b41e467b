"""What a run costs: GPU-hours and traffic, and with prices, dollars.

Pure arithmetic on figures a run (its summary) or ``lowbw plan`` already
has: the simulated time, the number of devices and the bytes sent.

* ``gpu_hours`` = devices x seconds / 3600: every worker holds its device
  for the whole simulated time, also while it waits for the network;
* ``traffic_gb`` = bytes sent by all workers / 1e9 (what a cloud bills as
  egress; what is received is not counted twice);
* with ``gpu_price`` ($ per GPU-hour) ``compute_cost_usd``, with
  ``egress_price`` ($ per GB sent) ``traffic_cost_usd``; ``cost_usd`` is the
  sum of the parts priced. Storage and anything else is not counted.
"""

import math
from typing import Any

from lowbw import _validate
from lowbw.telemetry import _metrics as names

SECONDS_PER_HOUR = 3600.0
BYTES_PER_GB = 1e9

PRICES = {"gpu_price": "dollars per GPU-hour",
          "egress_price": "dollars per GB sent"}


def check_price(field: str, value: Any) -> float | None:
  """``value`` (a number, or its text from a flag) as a float, or None when
  unset; a ConfigError naming ``field`` otherwise."""
  if value is None:
    return None
  number = value
  if isinstance(value, str):
    try:
      number = float(value)
    except ValueError:
      number = None
  if (isinstance(number, bool) or not isinstance(number, (int, float))
      or not math.isfinite(number) or number < 0):
    raise _validate.fail(field, value, f"expected a price in "
                         f"{PRICES[field]}: a finite number >= 0")
  return float(number)


def check_prices(gpu_price, egress_price, clock: bool) -> tuple:
  """Both prices checked; a GPU price needs the simulated clock (its
  GPU-hours come from sim_time_s)."""
  gpu_price = check_price("gpu_price", gpu_price)
  egress_price = check_price("egress_price", egress_price)
  if gpu_price is not None and not clock:
    raise _validate.fail("gpu_price", gpu_price, "needs the simulated clock "
                         "(GPU-hours are workers x sim_time_s); leave "
                         "clock on, or give egress_price only")
  return gpu_price, egress_price


def figures(devices: int, seconds: float | None, sent_bytes: float,
            gpu_price: float | None = None,
            egress_price: float | None = None) -> dict:
  """GPU-hours and GB sent; the dollars of each price given, and their sum.

  Args:
    devices: devices held for the whole ``seconds`` (workers, nodes).
    seconds: the run's simulated time (None without a clock: no GPU-hours).
    sent_bytes: bytes all devices send over the run.
    gpu_price, egress_price: dollars per GPU-hour and per GB sent, or None.
  """
  hours = None if seconds is None else devices * seconds / SECONDS_PER_HOUR
  gb = sent_bytes / BYTES_PER_GB
  out = {names.GPU_HOURS: hours, names.TRAFFIC_GB: gb}
  parts = []
  if gpu_price is not None and hours is not None:
    out[names.COMPUTE_COST_USD] = hours * gpu_price
    parts.append(out[names.COMPUTE_COST_USD])
  if egress_price is not None:
    out[names.TRAFFIC_COST_USD] = gb * egress_price
    parts.append(out[names.TRAFFIC_COST_USD])
  if parts:
    out[names.COST_USD] = sum(parts)
  return out


def of_summary(summary: dict, gpu_price=None, egress_price=None) -> dict:
  """``figures`` of a run from its summary's own ``num_workers``,
  ``sim_time_s`` and ``sent_bytes``."""
  return figures(summary["num_workers"], summary["sim_time_s"],
                 summary["sent_bytes"], gpu_price, egress_price)


def price_type(field: str):
  """The type of a price setting: a flag's text or a file's number, checked
  by ``check_price`` (its error names ``field``)."""

  def parse(text):
    return check_price(field, text)

  parse.config_types = float  # a file gives a number, never text
  parse.parse = lambda value, name: check_price(name, value)
  return parse

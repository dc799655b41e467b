"""``lowbw advise``: which method to use for a model and a fleet."""

import inspect
import json
import math

from lowbw import _validate
from lowbw.cli._parser import settings
from lowbw.config import _fields
from lowbw.studies import _advise


def seeds(text: str) -> list[int]:
  try:
    return [int(s) for s in text.split(",")]
  except ValueError:
    raise _validate.fail("seeds", text, "expected integers, comma-separated "
                         "(0,1,2)") from None


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "advise", help="which method to use for a model and a fleet",
      description="Rank candidate methods (strategy, H, codec) for training "
      "a model of --params parameters on --tokens tokens with --workers "
      "workers on a fleet: a probe study at laptop scale measures each "
      "one's token efficiency against DDP (the paired DDP lane), and the "
      "clock times one of its steps on the fleet at the model's size; the "
      "table gives each one's time, bytes and dollars with intervals over "
      "seeds. With --target-loss instead, the task is the probe itself and "
      "each candidate's time to that loss on the fleet is measured "
      "(docs/advise.md).")
  p.add_argument("--params", help="the model's parameters (1B, 350M, or a "
                 "number)")
  p.add_argument("--tokens", help="the token budget DDP would train on "
                 "(20B, or a number)")
  p.add_argument("--target-loss", type=float, help="instead of --params and "
                 "--tokens: the evaluation loss to reach on the probe's own "
                 "task (--probe, --probe-steps); ranks by the measured time "
                 "to it")
  p.add_argument("--workers", type=int, help="workers of the fleet "
                 "(default: the probe's, else 8)")
  p.add_argument("--tokens-per-step", help="tokens one worker processes per "
                 "step at full scale (default "
                 f"{_default(_advise.advise, 'tokens_per_step')})")
  g = p.add_argument_group("the fleet (lowbw train's network flags)")
  for flag, name, text in (
      ("--bandwidth", "bandwidth", "each worker's link"),
      ("--upload-bandwidth", "upload_bandwidth", "its upload rate, when "
       "slower"),
      ("--latency", "latency", "one-way latency"),
      ("--hardware", "hardware", "per worker: a preset, a peak (312TFLOPS) "
       "or seconds per step"),
      ("--mfu", "mfu", "model-FLOP utilisation"),
      ("--speeds", "speeds", "per-worker relative speeds (1,1,0.5) or a "
       "trace file, as lowbw train's"),
      ("--network-profile", "profile", "what real links cost: calibrated, "
       "ideal or a YAML file")):
    default = _NETWORK[name if name != "profile" else "network_profile"]
    g.add_argument(flag, dest=name, type=float if name == "mfu" else str,
                   help=text + ("" if default is None else
                                f" (default {default})"))
  g.add_argument("--gpu-price", type=float, help="$ per GPU-hour")
  g.add_argument("--egress-price", type=float, help="$ per GB sent")
  q = p.add_argument_group("the probe")
  q.add_argument("--candidate", type=settings(
      "candidate", "strategy=diloco,H=50"), action="append",
                 metavar="NAME=VALUE,...", help="a candidate's settings "
                 "(again for more; default DDP, DiLoCo H 10 and 50, DiLoCo H "
                 "50 with quant:4)")
  q.add_argument("--seeds", type=seeds, help="the probe's seeds (default "
                 + ",".join(map(str, _default(_advise.advise, "seeds")))
                 + ")")
  q.add_argument("--probe-steps", type=int, help="the probe's steps "
                 f"(default {_advise.PROBE['steps']})")
  q.add_argument("--probe", type=settings("probe", "hidden=64"),
                 metavar="NAME=VALUE,...",
                 help="other settings of the probe's runs (default "
                 + ",".join(f"{k}={v}" for k, v in _advise.PROBE.items()
                            if k != "steps") + ")")
  q.add_argument("--rank-by", choices=("time", "cost"), help="(default "
                 f"{_default(_advise.advise, 'rank_by')})")
  q.add_argument("--out", help="the probe study's folder (default a "
                 "temporary one)")
  p.add_argument("--json", action="store_true", help="print the rows and "
                 "notes as JSON")
  p.set_defaults(run=run)


def _default(function, name: str):
  """``function``'s own default for ``name`` (one source for the help)."""
  return inspect.signature(function).parameters[name].default


# lowbw train's network settings, for their defaults.
_NETWORK = {f.name: f.default for f in _fields.RUN_FIELDS}
FLEET = ("bandwidth", "upload_bandwidth", "latency", "hardware", "mfu",
         "speeds", "profile", "gpu_price", "egress_price")


def run(args) -> int:
  given = vars(args)
  fleet = {k: given[k] for k in FLEET if given.get(k) is not None}
  probe = dict(args.probe or {})
  if args.probe_steps is not None:
    probe["steps"] = args.probe_steps
  options = {k: given[k] for k in ("workers", "tokens_per_step", "seeds",
                                   "rank_by") if given.get(k) is not None}
  advice = _advise.advise(args.params, args.tokens,
                          target_loss=args.target_loss, fleet=fleet,
                          candidates=args.candidate, probe=probe,
                          out=args.out, **options)
  if args.json:
    print(json.dumps({"rows": advice.rows, "notes": advice.notes},
                     indent=1, default=str))
    return 0
  for line in table(advice):
    print(line)
  return 0


def table(advice) -> list[str]:
  target = any("target_loss" in r for r in advice.rows)
  lines = [f"{'#':>2}  {'candidate':<34} "
           + (f"{'steps':>8}  " if target else f"{'eta (90%)':<20} ")
           + f"{'time':>10}  {'time (90%)':<23} {'sent':>10} {'cost':>10}"]
  for i, r in enumerate(advice.rows, 1):
    what = ", ".join(f"{k}={v}" for k, v in r["candidate"].items())
    if math.isnan(r.get("time_s", math.nan)):
      lines.append(f"{i:>2}  {what:<34} " + (
          "did not reach the target" if target else "not measured"))
      continue
    first = (f"{r['steps']:>8.0f}  " if target else
             (f"{r['eta']:.3f} [{r['eta_low']:.3f}, {r['eta_high']:.3f}]"
              if math.isfinite(r["eta_low"]) else f"{r['eta']:.3f}")
             .ljust(20) + " ")
    span = (f"[{_time(r['time_low'])}, {_time(r['time_high'])}]"
            if math.isfinite(r["time_low"]) else "- (one seed)")
    cost = "-" if r["cost_usd"] is None else f"${r['cost_usd']:,.2f}"
    lines.append(f"{i:>2}  {what:<34} {first}"
                 f"{_time(r['time_s']):>10}  {span:<23} "
                 f"{_gb(r['sent_gb']):>10} {cost:>10}")
  return lines + [f"note: {n}" for n in advice.notes]


def _time(seconds: float) -> str:
  """Seconds in days, hours or minutes when they are that long."""
  from lowbw.network import format_duration
  for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
    if seconds >= scale:
      return f"{seconds / scale:.3g}{unit}"
  return format_duration(seconds)


def _gb(gb: float) -> str:
  return f"{gb:,.0f}GB" if gb >= 10 else f"{gb * 1e3:,.3g}MB"

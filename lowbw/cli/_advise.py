"""``lowbw advise``: which method to use for a model and a fleet."""

import json
import math

from lowbw import _validate
from lowbw.studies import _advise


def candidate(text: str) -> dict:
  """``--candidate strategy=diloco,H=50,codec=quant:4``: one candidate's
  settings (numbers as numbers)."""
  out = {}
  for part in text.split(","):
    name, sep, value = part.partition("=")
    if not sep or not name.strip() or not value.strip():
      raise _validate.fail("candidate", text, "expected name=value pairs, "
                           "comma-separated (strategy=diloco,H=50)")
    value = value.strip()
    for kind in (int, float):
      try:
        value = kind(value)
        break
      except ValueError:
        continue
    out[name.strip()] = value
  return out


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
      "seeds (docs/advise.md).")
  p.add_argument("--params", required=True, help="the model's parameters "
                 "(1B, 350M, or a number)")
  p.add_argument("--tokens", required=True, help="the token budget DDP "
                 "would train on (20B, or a number)")
  p.add_argument("--workers", type=int, default=8, help="workers of the "
                 "fleet (default 8)")
  p.add_argument("--tokens-per-step", default="8192", help="tokens one "
                 "worker processes per step at full scale (default 8192)")
  g = p.add_argument_group("the fleet")
  g.add_argument("--bandwidth", default="1Gbps", help="each worker's link "
                 "(default 1Gbps)")
  g.add_argument("--upload-bandwidth", help="its upload rate, when slower")
  g.add_argument("--latency", default="50ms", help="one-way latency "
                 "(default 50ms)")
  g.add_argument("--hardware", default="h100", help="per worker: a preset, "
                 "a peak (312TFLOPS) or seconds per step (default h100)")
  g.add_argument("--mfu", type=float, default=0.4, help="model-FLOP "
                 "utilisation (default 0.4)")
  g.add_argument("--network-profile", default="calibrated", help="what "
                 "real links cost: calibrated, ideal or a YAML file")
  g.add_argument("--gpu-price", type=float, help="$ per GPU-hour")
  g.add_argument("--egress-price", type=float, help="$ per GB sent")
  q = p.add_argument_group("the probe")
  q.add_argument("--candidate", type=candidate, action="append",
                 metavar="NAME=VALUE,...", help="a candidate's settings "
                 "(again for more; default DDP, DiLoCo H 10 and 50, DiLoCo H "
                 "50 with quant:4)")
  q.add_argument("--seeds", type=seeds, default=[0, 1, 2],
                 help="the probe's seeds (default 0,1,2)")
  q.add_argument("--probe-steps", type=int, help="the probe's steps "
                 f"(default {_advise.PROBE['steps']})")
  q.add_argument("--probe", type=candidate, metavar="NAME=VALUE,...",
                 help="other settings of the probe's runs (default "
                 + ",".join(f"{k}={v}" for k, v in _advise.PROBE.items()
                            if k != "steps") + ")")
  q.add_argument("--rank-by", default="time", choices=("time", "cost"))
  q.add_argument("--out", help="the probe study's folder (default a "
                 "temporary one)")
  p.add_argument("--json", action="store_true", help="print the rows and "
                 "notes as JSON")
  p.set_defaults(run=run)


def run(args) -> int:
  fleet = {"bandwidth": args.bandwidth, "latency": args.latency,
           "hardware": args.hardware, "mfu": args.mfu,
           "profile": args.network_profile, "gpu_price": args.gpu_price,
           "egress_price": args.egress_price}
  if args.upload_bandwidth:
    fleet["upload_bandwidth"] = args.upload_bandwidth
  probe = dict(args.probe or {})
  if args.probe_steps is not None:
    probe["steps"] = args.probe_steps
  advice = _advise.advise(args.params, args.tokens, workers=args.workers,
                          tokens_per_step=args.tokens_per_step, fleet=fleet,
                          candidates=args.candidate, probe=probe,
                          seeds=args.seeds, rank_by=args.rank_by,
                          out=args.out)
  if args.json:
    print(json.dumps({"rows": advice.rows, "notes": advice.notes},
                     indent=1, default=str))
    return 0
  for line in table(advice):
    print(line)
  return 0


def table(advice) -> list[str]:
  from lowbw.network import format_duration
  lines = [f"{'#':>2}  {'candidate':<34} {'eta (90%)':<20} {'time':>10}  "
           f"{'time (90%)':<23} {'sent':>10} {'cost':>10}"]
  for i, r in enumerate(advice.rows, 1):
    what = ", ".join(f"{k}={v}" for k, v in r["candidate"].items())
    if math.isnan(r.get("time_s", math.nan)):
      lines.append(f"{i:>2}  {what:<34} not measured")
      continue
    eta = f"{r['eta']:.3f} [{r['eta_low']:.3f}, {r['eta_high']:.3f}]"
    span = (f"[{format_duration(r['time_low'])}, "
            f"{format_duration(r['time_high'])}]")
    cost = "-" if r["cost_usd"] is None else f"${r['cost_usd']:,.0f}"
    lines.append(f"{i:>2}  {what:<34} {eta:<20} "
                 f"{format_duration(r['time_s']):>10}  {span:<23} "
                 f"{r['sent_gb']:>8,.0f}GB {cost:>10}")
  return lines + [f"note: {n}" for n in advice.notes]

"""``lowbw fit``: a study's results fitted into a law, with intervals."""

import json

from lowbw.cli._parser import settings
from lowbw.studies import _fit


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "fit", help="fit a study's results into a law (power, joint, log)",
      description="Fit a law to a finished study's results: a power law "
      "with an irreducible term (Hoffmann et al., arXiv 2203.15556), the "
      "joint power law in model size and replicas (Charles et al., arXiv "
      "2503.09799) or a logarithmic trend, with bootstrap intervals over "
      "seeds; print the parameters, the fit's residuals and predictions at "
      "points not run (docs/fits.md).")
  p.add_argument("study", metavar="STUDY", help="a study's folder (lowbw "
                 "sweep --out)")
  p.add_argument("--x", nargs="+", required=True, metavar="NAME",
                 help="the inputs: grid or config fields (H, workers) or "
                 "summary figures (num_params, tokens); params/N stand for "
                 "num_params, M/W for workers")
  p.add_argument("--y", default="final_eval_loss", help="the summary figure "
                 "fitted (default final_eval_loss)")
  p.add_argument("--form", default="power", choices=sorted(_fit.FORMS),
                 help="the law (default power)")
  p.add_argument("--predict", type=settings(
      "predict", "params=1e9,tokens=2e10", numbers=True), action="append",
      default=[],
                 metavar="NAME=VALUE,...", help="a point to predict (again "
                 "for more)")
  p.add_argument("--bootstrap", type=int, default=_fit.BOOTSTRAP,
                 help=f"bootstrap draws (default {_fit.BOOTSTRAP}; 0: no "
                 "intervals)")
  p.add_argument("--confidence", type=float, default=0.9,
                 help="the intervals' central share (default 0.9)")
  p.add_argument("--where", type=settings("where", "strategy=diloco"),
                 metavar="NAME=VALUE,...", help="fit only the points with "
                 "these values (grid values or config fields)")
  p.add_argument("--out", metavar="FIT.json", help="write the fit as JSON")
  p.add_argument("--plot", metavar="FIT.png", help="draw measured against "
                 "fitted (needs matplotlib)")
  p.add_argument("--json", action="store_true", help="print the fit and "
                 "predictions as JSON")
  p.set_defaults(run=run)


def run(args) -> int:
  f = _fit.fit(args.study, args.x, args.y, args.form, args.bootstrap,
               args.confidence, where=args.where or None)
  predictions = f.predict(args.predict) if args.predict else []
  if args.out:
    f.save(args.out)
  if args.plot:
    f.plot(args.plot)
  if args.json:
    d = f.describe()
    print(json.dumps({k: v for k, v in d.items() if k != "samples"}
                     | {"predictions": predictions}, indent=1))
    return 0
  for line in _text(f, predictions):
    print(line)
  return 0


def _text(f, predictions: list[dict]) -> list[str]:
  share = f"{f.confidence:.0%}"
  q = f.quality()
  lines = [f"{f.y} as a {f.form} law of {', '.join(f.x)} "
           f"({_fit.FORMS[f.form].paper}), {len(f.rows)} combinations:",
           f"  {'parameter':<16} {'value':>12}   {share} interval"]
  for name, value in f.params.items():
    lo, hi = f.intervals[name]
    lines.append(f"  {name:<16} {value:>12.5g}   [{lo:.5g}, {hi:.5g}]")
  r2 = "n/a" if q["r2"] is None else f"{q['r2']:.4f}"
  lines.append(f"  R^2 {r2}; |relative residual| median "
               f"{q['median_rel_residual']:.2%}, max "
               f"{q['max_rel_residual']:.2%}")
  for p in predictions:
    at = ", ".join(f"{n}={p[n]:g}" for n in f.x)
    wide = abs(p["high"] - p["low"]) > 0.2 * abs(p[f.y])
    lines.append(f"  at {at}: {f.y} {p[f.y]:.5g} ({share} interval "
                 f"[{p['low']:.5g}, {p['high']:.5g}])" + (
                     "; wide: more points or seeds, or a point nearer the "
                     "study's, narrow it" if wide else ""))
  return lines

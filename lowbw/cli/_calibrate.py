"""``lowbw calibrate``: the clock's network profile fitted to measured runs."""

import os

from lowbw import _validate
from lowbw.network import _calibrate, _profile


def calls(text: str):
  """``--calls``: "fused", "per_tensor" or a number of calls >= 1."""
  if text in _profile.CALLS:
    return text
  try:
    number = int(text)
  except ValueError:
    number = 0
  if number < 1:
    raise _validate.fail("calls", text, "expected 'fused', 'per_tensor' or a "
                         "number of calls >= 1")
  return number


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "calibrate", help="fit the clock's network profile to measured runs",
      description="Fit the simulated clock's network profile (link "
      "efficiency per rate, seconds per collective call, the first sync's "
      "start-up, host seconds per step) to runs measured on your cluster, "
      "print the terms and the fit's errors per method, and write the "
      "profile as YAML for lowbw train --network-profile (docs/"
      "calibration.md). MEASUREMENTS.csv has one row per run with the "
      "columns " + ", ".join(_calibrate.REQUIRED) + " and optionally "
      + ", ".join(_calibrate.OPTIONAL) + ".")
  p.add_argument("measurements", metavar="MEASUREMENTS.csv",
                 help="one row per measured run")
  p.add_argument("--out", required=True, metavar="PROFILE.yaml",
                 help="where to write the fitted profile")
  p.add_argument("--iperf3", nargs="+", action="extend", default=[],
                 metavar="FILE", help="iperf3 -J results of the cluster's "
                 "node pairs: their mean rate is the bandwidth of rows that "
                 "leave bandwidth_bps empty (unshaped links)")
  p.add_argument("--calls", type=calls, default="fused",
                 help="collective calls per sync of the trainer the profile "
                 "will time: fused (one buffer, as lowbw's engine sends), "
                 "per_tensor or a number (default fused)")
  p.set_defaults(run=run)


def _terms(runs, profile) -> list[str]:
  """The fitted terms, each with the rows it came from."""
  def measured(column):
    n = sum(getattr(r, column) is not None for r in runs)
    return (f"median of {n} rows' {column}" if n else
            f"no row has {column}: the default profile's")
  eff = ", ".join(f"{b / 1e6:g} Mbit/s: {e:.3f}" for b, e in
                  profile.efficiency)
  return [f"efficiency   {eff}",
          f"per_call_s   {profile.per_call_s:.6g}",
          f"startup_s    {profile.startup_s:.6g}   "
          f"({measured('first_sync_extra_s')})",
          f"host_s       {profile.host_s:.6g}   "
          f"({measured('host_s_per_step')})",
          f"calls        {profile.calls}"]


def run(args) -> int:
  runs = _calibrate.read_rows(args.measurements, args.iperf3)
  folder = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(folder):
    raise _validate.fail("out", args.out, f"its folder {folder} does not "
                         "exist")
  profile = _calibrate.fit(runs, calls=args.calls)
  print(f"fitted on {len(runs)} runs of {args.measurements}:")
  for line in _terms(runs, profile):
    print("  " + line)
  print("\nrelative error of the fit on these runs, |predicted / measured - 1| "
        "(one round, first sync left out):")
  print(f"  {'method':<12}{'runs':>5}  {'sync median':>11}{'max':>8}  "
        f"{'CU median':>9}{'max':>8}")
  for method, s in _calibrate.residuals(runs, profile).items():
    print(f"  {method:<12}{s['runs']:>5}  {100 * s['sync']['median']:>10.1f}%"
          f"{100 * s['sync']['max']:>7.1f}%  {100 * s['cu']['median']:>8.1f}%"
          f"{100 * s['cu']['max']:>7.1f}%")
  _profile.save(profile, args.out)
  print(f"\nwrote {args.out} (lowbw train --network-profile {args.out})")
  return 0

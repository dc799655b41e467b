"""A pipeline's step on the clock (``network.timeline``): each schedule's
op order, and whole timelines written out here by hand (stage by stage,
op by op) against the function's."""

import math

import numpy as np
import pytest

from lowbw import ConfigError, network
from lowbw.network import _pipeline


def _ops(timeline):
  return [[(k, i, s, e) for k, i, s, e in stage] for stage in timeline.ops]


def test_schedule_orders():
  assert _pipeline.order("gpipe", 3, 2, 1) == [
      ("F", 0), ("F", 1), ("B", 0), ("B", 1)]
  # 1F1B: S - 1 - s warm-up forwards on stage s, then F and B in turn.
  assert _pipeline.order("1f1b", 3, 4, 0) == [
      ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2),
      ("B", 3)]
  assert _pipeline.order("1f1b", 3, 4, 1) == [
      ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
      ("B", 3)]
  assert _pipeline.order("1f1b", 3, 4, 2) == [
      ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3),
      ("B", 3)]
  # Fewer micro-batches than warm-up slots: every forward, then backwards.
  assert _pipeline.order("1f1b", 4, 2, 0) == [
      ("F", 0), ("F", 1), ("B", 0), ("B", 1)]


# Forward 1 s, backward 2 s on each stage; the hop holds its link 0.5 s
# forward and 0.25 s backward.
HOPS = dict(forward_s=[1, 1], backward_s=[2, 2], hop_forward_s=[0.5],
            hop_backward_s=[0.25], micro_batches=2)


def test_s2_m2_gpipe_by_hand():
  t = network.timeline(**HOPS, schedule="gpipe")
  # stage 0: F0 0-1, F1 1-2; activations arrive at 1.5 and 2.5.
  # stage 1: F0 1.5-2.5, F1 2.5-3.5, B0 3.5-5.5, B1 5.5-7.5;
  #          gradients arrive at 5.75 and 7.75.
  # stage 0: B0 5.75-7.75, B1 7.75-9.75.
  assert _ops(t) == [
      [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5.75, 7.75),
       ("B", 1, 7.75, 9.75)],
      [("F", 0, 1.5, 2.5), ("F", 1, 2.5, 3.5), ("B", 0, 3.5, 5.5),
       ("B", 1, 5.5, 7.5)]]
  assert t.makespan_s == 9.75
  assert t.busy_s == (6.0, 6.0)
  assert t.bubble == pytest.approx(1 - 6 / 9.75)


def test_s2_m2_1f1b_by_hand():
  t = network.timeline(**HOPS, schedule="1f1b")
  # stage 1 runs F0 B0 F1 B1: F0 1.5-2.5, B0 2.5-4.5, then F1 (its
  # activation there since 2.5) 4.5-5.5, B1 5.5-7.5; gradients arrive at
  # 4.75 and 7.75. Stage 0: F0 0-1, F1 1-2, B0 4.75-6.75, B1 7.75-9.75.
  assert _ops(t) == [
      [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 4.75, 6.75),
       ("B", 1, 7.75, 9.75)],
      [("F", 0, 1.5, 2.5), ("B", 0, 2.5, 4.5), ("F", 1, 4.5, 5.5),
       ("B", 1, 5.5, 7.5)]]
  assert t.makespan_s == 9.75


def test_s3_m4_1f1b_bubble_by_hand():
  """Equal stages, free hops: the bubble is (S-1)/(M+S-1) of the step,
  which lasts (M+S-1)(f+b)."""
  t = network.timeline([1] * 3, [2] * 3, [0, 0], [0, 0], 4, "1f1b")
  assert _ops(t)[0] == [
      ("F", 0, 0, 1), ("F", 1, 1, 2), ("F", 2, 2, 3), ("B", 0, 7, 9),
      ("F", 3, 9, 10), ("B", 1, 10, 12), ("B", 2, 13, 15),
      ("B", 3, 16, 18)]
  assert _ops(t)[1] == [
      ("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 5, 7), ("F", 2, 7, 8),
      ("B", 1, 8, 10), ("F", 3, 10, 11), ("B", 2, 11, 13),
      ("B", 3, 14, 16)]
  assert _ops(t)[2] == [
      ("F", 0, 2, 3), ("B", 0, 3, 5), ("F", 1, 5, 6), ("B", 1, 6, 8),
      ("F", 2, 8, 9), ("B", 2, 9, 11), ("F", 3, 11, 12), ("B", 3, 12, 14)]
  assert t.makespan_s == 18
  assert t.bubble == pytest.approx(2 / 6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(1, 1), (1, 3), (2, 1), (3, 2),
                                          (4, 8), (5, 3)])
def test_equal_stages_without_hops_follow_the_formula(schedule, stages,
                                                      micro):
  f, b = 0.3, 0.7
  t = network.timeline([f] * stages, [b] * stages, [0] * (stages - 1),
                       [0] * (stages - 1), micro, schedule)
  assert t.makespan_s == pytest.approx((micro + stages - 1) * (f + b))
  assert t.bubble == pytest.approx((stages - 1) / (micro + stages - 1))


def test_a_hops_transfers_queue_on_its_link_but_latency_does_not():
  slow_link = network.timeline([1, 1], [2, 2], [3.0], [0.0], 2, "gpipe")
  # Activations hold the link 1-4 and 4-7: stage 1 F0 4-5, F1 7-8, B0 8-10,
  # B1 10-12; stage 0 B0 10-12, B1 12-14.
  assert [op[2:] for op in slow_link.ops[1]] == [(4, 5), (7, 8), (8, 10),
                                                 (10, 12)]
  assert slow_link.makespan_s == 14
  latency = network.timeline([1, 1], [2, 2], [(0.0, 3.0)], [(0.0, 0.0)], 2,
                             "gpipe")
  # Both messages in flight at once: they arrive at 4 and 5.
  assert [op[2:] for op in latency.ops[1]] == [(4, 5), (5, 6), (6, 8),
                                               (8, 10)]
  assert latency.makespan_s == 12


def test_uneven_stages_wait_for_the_slowest():
  # Stage 1 twice as slow: 1F1B at M=3, free hops. Stage 0 F0 0-1 F1 1-2;
  # stage 1 F0 1-3 B0 3-7 F1 7-9 B1 9-13 F2 13-15 B2 15-19; stage 0 B0 7-9
  # F2 9-10 B1 13-15 B2 19-21.
  t = network.timeline([1, 2], [2, 4], [0], [0], 3, "1f1b")
  assert _ops(t)[0] == [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 7, 9),
                        ("F", 2, 9, 10), ("B", 1, 13, 15), ("B", 2, 19, 21)]
  assert t.makespan_s == 21
  assert t.busy_s == (9.0, 18.0)
  assert t.bubble == pytest.approx(1 - 18 / 21)


def test_nothing_to_do_takes_no_time():
  t = network.timeline([0, 0], [0, 0], [0], [0], 2)
  assert t.makespan_s == 0 and t.bubble == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(hop_forward_s=[]), "hop_forward_s.*one value per hop, 1"),
    (dict(backward_s=[1]), "backward_s.*one value per stage"),
    (dict(micro_batches=0), "micro_batches"),
    (dict(schedule="zb"), "pipeline_schedule.*'zb'.*1f1b, gpipe"),
    (dict(forward_s=[1, -1]), "forward_s.*>= 0"),
    (dict(hop_backward_s=[math.inf]), "hop_backward_s.*finite"),
])
def test_bad_timeline_input_names_the_argument(kwargs, match):
  args = dict(forward_s=[1, 1], backward_s=[2, 2], hop_forward_s=[0],
              hop_backward_s=[0], micro_batches=2, schedule="1f1b")
  with pytest.raises(ConfigError, match=match):
    network.timeline(**{**args, **kwargs})


def test_step_timeline_splits_the_step_by_stage_flops():
  """A third of each stage's FLOPs share forward, two thirds backward, per
  micro-batch; each hop its bytes over its bandwidth plus latency."""
  p = network.Pipeline(stage_flops=(1, 3), micro_batches=2,
                       schedule="gpipe", forward_bytes=(1000,),
                       backward_bytes=(500,), bandwidth=(8000.0,),
                       latency=(0.25,))
  got = _pipeline.step_timeline(p, 12.0)
  # stage s: 12 * share / M: 1.5 and 4.5 s per micro-batch.
  want = network.timeline([0.5, 1.5], [1.0, 3.0], [(1.0, 0.25)],
                          [(0.5, 0.25)], 2, "gpipe")
  assert got == want
  assert sum(got.busy_s) == pytest.approx(12.0)
  free = p._replace(bandwidth=(math.inf,), latency=(0.0,))
  assert _pipeline.step_timeline(free, 12.0).makespan_s == pytest.approx(
      network.timeline([0.5, 1.5], [1.0, 3.0], [0], [0], 2,
                       "gpipe").makespan_s)
  assert p.bytes_per_step() == 2 * (1000 + 500)
  np.testing.assert_allclose(_pipeline.hop_seconds(1000, 8000.0, 0.25),
                             (1.0, 0.25))


def test_the_clock_against_the_planners_pipeline_step():
  """A pp_group_diloco plan (300B parameters): with the planner's compute
  per micro-batch slot and no communication, the clock's GPipe step is the
  planner's (M + S - 1) slots; with the planner's activation bits on each
  hop, both ways, and its latency, the clock is faster than the planner,
  whose every slot waits for the whole transfer and a round trip, while
  the clock sends during the next micro-batch's compute and pays latency
  per hop. GPipe's hop 0 carries M messages each way, one direction after
  the other: a floor the clock respects."""
  out = network.plan(parameters=300, straggler_mitigation="threshold",
                     micro_batches=8, bandwidth="100Mbps", latency="50ms")
  assert out["mode"] == "pp_group_diloco"
  s, m, slot = out["pipeline_stages"], 8, out["t_micro_comp_s"]
  assert out["straggler_factor_pipeline"] == 1.0
  fwd, bwd = [slot / 3] * s, [2 * slot / 3] * s
  bare = network.timeline(fwd, bwd, [0] * (s - 1), [0] * (s - 1), m, "gpipe")
  comm = (out["t_micro_comm_s"] + 2 * 0.05) * (m + s - 1)
  assert bare.makespan_s == pytest.approx(out["t_pp_step_s"] - comm)
  link = out["activation_bits"] / m / 100e6
  assert 2 * link == pytest.approx(out["t_micro_comm_s"])
  hops = [(link, 0.05)] * (s - 1)
  gpipe = network.timeline(fwd, bwd, hops, hops, m, "gpipe")
  one_f = network.timeline(fwd, bwd, hops, hops, m, "1f1b")
  assert 2 * m * link < gpipe.makespan_s < out["t_pp_step_s"]
  assert m * link < one_f.makespan_s < gpipe.makespan_s

"""Metric names: CSV columns, TensorBoard tags and ``result.history`` keys.

These names are a public contract (DESIGN.md): add new ones, never rename.
"""

STEP = "step"
EXAMPLES = "examples"
TOKENS = "tokens"
TRAIN_LOSS = "train_loss"
EVAL_LOSS = "eval_loss"
EVAL_ACCURACY = "eval_accuracy"
EVAL_PERPLEXITY = "eval_perplexity"
PAYLOAD_BYTES = "payload_bytes"
WIRE_BYTES = "wire_bytes"
PEAK_STEP_BYTES = "peak_step_bytes"  # most wire bytes one step sent, per worker
# Fleet totals, cumulative: the bytes the workers that took part in each
# communication (those it averaged) sent and received under its collective,
# each priced as one worker's share of ``wire_bytes``. Without faults or
# stragglers, W x ``wire_bytes`` (sent; received too, except from a
# parameter server, where a worker receives its download).
SENT_BYTES = "sent_bytes"
RECEIVED_BYTES = "received_bytes"
# A pipeline's boundaries (stages > 1), cumulative, per worker: the
# activations and activation gradients its stages sent each other (every
# hop, every micro-batch), apart from the strategy's payload and wire bytes.
STAGE_BYTES = "stage_bytes"
# A pipeline's summary: the share of a step its busiest stage is idle.
PIPELINE_BUBBLE = "pipeline_bubble"
SIM_TIME_S = "sim_time_s"
SYNC_WORKERS = "sync_workers"  # workers averaged by the last communication
WORKERS_UP = "workers_up"  # under faults: the workers in the fleet that step
WALL_TIME_S = "wall_time_s"
WORKER_DIVERGENCE = "worker_divergence"
# Mean pairwise Pearson correlation of the workers' parameter vectors, at the
# end of a round before its sync (with correlation_every).
WORKER_CORRELATION = "worker_correlation"
# exp of the mean training cross-entropy since the previous row (language
# models).
TRAIN_PERPLEXITY = "train_perplexity"
# Each worker's own parameters evaluated (with eval_local): their mean
# loss, its spread over workers, and each model metric's mean.
EVAL_LOCAL_LOSS = "eval_local_loss"
EVAL_LOCAL_LOSS_STD = "eval_local_loss_std"
# The paired DDP lane (shadow="ddp"): a DDP replica trained on the union of
# the workers' batches, evaluated on the same windows; the gap is
# eval_loss / shadow_eval_loss - 1.
SHADOW_EVAL_LOSS = "shadow_eval_loss"
# Every run's summary (with a clock and a hardware): useful tokens over the
# tokens the fleet could have processed in the simulated time.
GOODPUT = "goodput"
SHADOW_GAP = "shadow_gap"
# A summary figure of a run with the lane: its token efficiency against
# DDP (the lane's steps to the run's final loss over the run's steps; over
# 1 when the run beats the lane).
TOKEN_EFFICIENCY = "token_efficiency"
LR = "lr"
# What a run costs (summary keys, also in ``lowbw plan``'s outputs;
# ``_cost.figures``): device time as GPU-hours (every worker held for the
# whole sim_time_s), the GB the workers send (sent_bytes / 1e9), and, with
# gpu_price and egress_price, dollars for each and their sum.
GPU_HOURS = "gpu_hours"
TRAFFIC_GB = "traffic_gb"
COMPUTE_COST_USD = "compute_cost_usd"
TRAFFIC_COST_USD = "traffic_cost_usd"
COST_USD = "cost_usd"


def train_metric(name: str) -> str:
  """Column of a model metric averaged over workers and steps, e.g. train_accuracy."""
  return "train_" + name


def eval_metric(name: str) -> str:
  return "eval_" + name


def tier_wire_bytes(tier: str) -> str:
  """Column of the wire bytes of one tier of a two-tier strategy (per worker,
  cumulative), e.g. wire_bytes_regional, wire_bytes_global."""
  return "wire_bytes_" + tier


def strategy_metric(name: str) -> str:
  """Column of a strategy's own metric (a non-channel entry of its report),
  e.g. strategy_pseudo_grad_norm: the latest value reported at or before
  the row's step."""
  return "strategy_" + name

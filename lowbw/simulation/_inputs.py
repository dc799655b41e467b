"""A run's inputs: the seeded initial state (from a finished run's
parameters with ``init_from``), the workers' shards, the traced values of
``hparams`` and the network numbers, placed on the run's devices."""

import functools
import os

import jax
import jax.numpy as jnp

from lowbw import _validate, telemetry
from lowbw import data as data_lib
from lowbw.network import _clock
from lowbw.config import _settings as _config
from lowbw.simulation import (_bits, _density, _engine, _hparams, _mesh,
                              _pace, _precision, _shadow)

# Parameter arrays past which a one-device CPU run makes its initial state
# as one compiled program rather than op by op (see ``state_program``):
# the built-in MLP and CNN have 4 to 8, a GPT 17 or more.
EAGER_INIT_MAX_ARRAYS = 16


def initial_state(c, example, key, params=None) -> _engine.SimState:
  """The state of a run of ``c`` (a ``RunConfig``) from ``key``; every
  worker (and the DDP lane) starts from ``params`` when given
  (``init_from``), else from the model's initialisation of ``example``."""
  init_key, data_key, strategy_key, loss_key = jax.random.split(key, 4)
  if params is None:
    params = c.model.init(init_key, example)
  st = c.strategy.init(params, 1 if c.one_replica else c.workers,
                       strategy_key)
  if _engine.stored_dtype(c) is not None:
    st = _precision.cast_workers(st, _engine.stored_dtype(c))
  active = jnp.ones(c.workers, bool) if c.masks else None
  fleet = (_pace.start(c.workers, _pace.fragments_of(c.strategy))
           if c.strategy.asynchronous else None)
  traced = c.network is not None and (
      c.network.speed_trace is not None or
      c.network.bandwidth_trace is not None or
      bool(c.pipeline is not None and c.pipeline.bandwidth_trace))
  time_s = jnp.zeros(2, jnp.float32) if traced else None
  shadow = None if c.shadow is None else _shadow.init(c.shadow, params)
  period = (jnp.asarray(c.period, jnp.int32) if c.traced_period else None)
  keep = _density.counts(c, params) if c.traced_density else None
  levels = _bits.levels(c) if c.traced_bits else None
  return _engine.SimState(st, data_key, loss_key, active, fleet, time_s,
                          shadow, period, keep, levels)


def place_mesh(c, facts, key):
  """``(mesh, specs)`` spreading the workers over ``c.devices`` devices:
  ``specs = (sim_specs, sampler_specs)`` say which leaves are per worker."""
  mesh = _mesh.make_mesh(c.devices)
  # Only its shape matters (``strategy_specs`` compares shapes): abstract,
  # as an eager split compiled two programs in every process (0.2-0.3 s).
  strategy_key = jax.eval_shape(lambda k: jax.random.split(k, 4)[2], key)
  state = facts.abstract_state
  sim_specs = _engine.SimState(
      _mesh.strategy_specs(c.strategy, facts.abstract_params, c.workers,
                           strategy_key),
      _mesh.replicated(state.data_key), _mesh.replicated(state.loss_key),
      _mesh.active_specs(c.masks),
      _mesh.fleet_specs(c.strategy.asynchronous),
      _mesh.replicated(state.time_s), _mesh.replicated(state.shadow),
      _mesh.replicated(state.period), _mesh.replicated(state.keep),
      _mesh.replicated(state.levels))
  return mesh, (sim_specs, _mesh.sampler_specs(build_sampler(c, 0)))


def build_sampler(c, seed: int):
  """The workers' shards for ``seed``: the data's ``build``, or with
  ``clients`` a ``data.client_sampler`` (the workers are sampled clients)."""
  if c.clients is None:
    return c.data.build(c.workers, c.batch_size, seed)
  available = (None if c.availability is None else
               data_lib.read_availability(c.availability, c.clients,
                                          c.workers))
  return data_lib.client_sampler(c.data, c.clients, c.workers, c.batch_size,
                                 seed, c.period, available)


class Inputs:
  """Makes a run's inputs for a seed and traced values (``initial``).

  Attributes:
    make: ``(key, params=None) -> SimState``, op by op.
    program: how a seeded state is made (``state_program``).
  """

  def __init__(self, config, facts, mesh, specs, compiled, prices):
    self.config, self.facts = config, facts
    self.mesh, self.specs = mesh, specs
    self.compiled, self.prices = compiled, prices
    self.processes = jax.process_count()
    self.make = functools.partial(initial_state, config, facts.example)
    self.program = self.state_program()
    # Compiled state programs by the traced values' names and types; a
    # dict, so that the views of a build (``_density.view`` copies this
    # object) share them.
    self._programs_compiled: dict = {}
    self._samplers: dict = {}
    self._placed_nets: dict = {}  # id(net) -> (net, it placed)
    self._keys: dict = {}  # seed -> its PRNG key

  def state_program(self):
    """How this run makes its initial state: ``make`` op by op, or compiled
    as one program.

    On one CPU device, a small model's state is made op by op: that keeps
    the bits of ``model.init`` called on its own (a compiled program may
    fuse its math differently, by an ulp), and a process that builds many
    runs (a notebook, the test suite) compiles each operation once; as one
    program per run it cost the suite minutes of compiling. A model of many
    parameter arrays (a GPT), or any model on an accelerator, is one
    compiled program: op by op the default GPT's ~170 arrays took 6.3 s in
    every fresh process on a CPU (2.3-3.0 s compiled, 0.5 s loaded from the
    persistent cache; benchmarks/startup.py), and an accelerator compiles
    each eager operation too. Over several devices of one process, one
    program that writes each worker's state straight to its device: placing
    an eager state cost 0.4 s, and the compiled program comes from the
    persistent cache in a fresh process, where the ~70 eager operations
    compile again every time (2.5 s on the digits MLP). Making the first
    state on another thread while the programs compile was measured too: no
    faster on a 2-core CPU, the threads contend.
    """
    if self.mesh is not None and self.processes == 1:
      return jax.jit(self.make_set, out_shardings=_mesh.shardings(
          self.facts.abstract_state, self.specs[0], self.mesh))
    if self.mesh is None and _compiled_init(self.facts.abstract_params):
      return jax.jit(self.make_set)
    return self.make

  def make_set(self, key, values: dict) -> _engine.SimState:
    """The state from ``key`` with the traced state ``values`` set (in the
    compiled program: set op by op and placed again, they cost a study's
    point 2 ms)."""
    return _hparams.set_state(self.make(key), values, self.config.strategy)

  def seeded_state(self, key, values: dict) -> _engine.SimState:
    """The initial state from ``key`` with the traced state ``values`` set.
    A compiled initial state is compiled ahead, once per kind of values,
    and counted as compiling (``compile_s``, traced and compiled or
    loaded), not as making the state."""
    if not hasattr(self.program, "lower"):  # op by op
      return self.make_set(key, values)
    kind = tuple((name, type(v).__name__, jnp.shape(v))
                 for name, v in values.items())
    if kind not in self._programs_compiled:
      self._programs_compiled[kind] = self.compiled.compile_init(
          self.program, key, values)
    return self._programs_compiled[kind](key, values)

  def placed(self) -> bool:
    """Whether ``seeded_state`` writes the state to the mesh's devices."""
    return self.mesh is not None and hasattr(self.program, "lower")

  def state(self, seed: int, state_values: dict, params=None):
    """The initial ``SimState`` of ``seed`` with traced ``state_values``
    set, from ``params`` when given; on the mesh where ``placed``, else
    on one device."""
    key = self.key(seed)
    if params is None:
      return self.seeded_state(key, state_values)
    state = self.make(key, params)
    return _hparams.set_state(state, state_values, self.config.strategy)

  def key(self, seed: int):
    """``jax.random.PRNGKey(seed)``, made once per seed (an eager op costs
    milliseconds, and a study starts many runs of the same seeds); keys are
    never donated."""
    keys = self._keys
    if seed not in keys:
      if len(keys) >= 16:
        keys.pop(next(iter(keys)))
      keys[seed] = jax.random.PRNGKey(seed)
    return keys[seed]

  def start_params(self, init_from: str | None):
    """The parameters in run folder ``init_from`` (its ``params.npz``), in
    the model's structure and types, or None; a folder written by another
    model is an error naming ``init_from``."""
    if init_from is None:
      return None
    if not isinstance(init_from, (str, os.PathLike)) or not str(init_from):
      raise _validate.fail("init_from", init_from, "expected the path of a "
                           "finished run's folder (holding params.npz)")
    try:
      return telemetry.load_params(init_from,
                                   like=self.facts.abstract_params)
    except _validate.ConfigError as e:
      raise _validate.fail("init_from", init_from, e.allowed) from None

  def check_hparams(self, hparams, field: str = "hparams"):
    """(state values, network) for ``hparams``; one-line errors."""
    values = _hparams.check_names(field, hparams or {})
    state_values, net_values = _hparams.split(values)
    _hparams.check_state_knobs(self.facts.abstract_state,
                               self.config.strategy, state_values)
    network = _hparams.set_network(self.config.network, net_values)
    if net_values:
      network = _clock.check_network(network, self.config.workers)
    return state_values, network

  def sampler(self, seed: int, placed: bool = False):
    """The workers' shards for ``seed`` (the last few are kept), on the
    run's devices when ``placed`` (kept so too: the programs never donate
    them)."""
    key = (seed, placed and self.mesh is not None)
    if key not in self._samplers:
      if len(self._samplers) >= 8:
        self._samplers.pop(next(iter(self._samplers)))
      self._samplers[key] = (
          _mesh.place(self.sampler(seed), self.specs[1], self.mesh)
          if key[1] else build_sampler(self.config, seed))
    return self._samplers[key]

  def initial(self, seed: int = 0, hparams: dict | None = None,
              init_from: str | None = None, sampler=None):
    """``(state, sampler, net, network)`` of a run from ``seed`` with
    ``hparams``, placed on the run's devices (see ``Simulator.initial``).
    ``sampler``: the shards to use instead of building them (a lane's:
    its run's, which are the same arrays, ``_lanes.shares_data``)."""
    seed = _config.check_seed(seed)
    state_values, network = self.check_hparams(hparams)
    params = self.start_params(init_from)
    state = self.state(seed, state_values, params)
    own = sampler is None
    if own:
      sampler = self.sampler(seed, placed=True)
    net = self.placed_net(self.prices.net_params(network, seed))
    if self.mesh is not None:
      sim_specs, sampler_specs = self.specs
      if params is not None or not self.placed():
        state = _mesh.place(state, sim_specs, self.mesh)
      if not own:
        sampler = _mesh.place(sampler, sampler_specs, self.mesh)
    return state, sampler, net, network

  def placed_net(self, net):
    """``net`` (the network's traced numbers, or None) on the run's
    devices, placed once per object (``Prices.net_params`` keeps one per
    network and seed; never donated)."""
    if net is None or self.mesh is None:
      return net
    nets = self._placed_nets
    if id(net) not in nets:
      if len(nets) >= 16:
        nets.pop(next(iter(nets)))
      nets[id(net)] = (net, _mesh.place(net, _mesh.replicated(net),
                                        self.mesh))
    return nets[id(net)][1]


def _compiled_init(abstract_params) -> bool:
  return (jax.default_backend() != "cpu"
          or len(jax.tree.leaves(abstract_params)) > EAGER_INIT_MAX_ARRAYS)

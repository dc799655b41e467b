"""A run's defaults: one table that ``lowbw.simulate``, ``lowbw.build`` and
``lowbw train`` all read, so the API and the command line run the same thing
when nothing is given.

The network is a value too: every run keeps a simulated clock
(``sim_time_s``) unless ``clock=False`` is given. Its link, topology,
hardware and profile defaults are ``lowbw.network.network()``'s.
"""

NUM_WORKERS = 8
BATCH_SIZE = 4     # examples (sequences) per worker per step
STEPS = 200        # the default GPT run: about a minute on a 2-core CPU
# The default run (no strategy named): DiLoCo syncing every 20 steps, so its
# 200 steps make 10 rounds (and 10 evaluations): a learning curve in its
# picture. Naming the strategy (--strategy diloco) gives its own default H.
DEFAULT_RUN_H = 20

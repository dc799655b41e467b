"""``lowbw.Config``: a whole run as one value, and its settings' table.

A ``Config`` is what ``lowbw train`` reads from flags and files, what every
run writes next to its logs (``config.yaml``), and what ``lowbw.simulate``,
``lowbw.build`` and ``lowbw.study`` take. This package sits below the
simulation package: it checks a run's settings (``_settings``: what a
compiled simulator is specialised to) and builds its strategy and network
once; ``lowbw.simulation`` builds and runs it.
"""

from lowbw.config._config import (ALIASES, FIELDS, GROUPS, Config, canonical,
                                  check_value, natural)
from lowbw.config._fields import RUN, SHAPE, TRACED, Field, flag_kwargs
from lowbw.config._files import FORMATS, read_config, read_file
from lowbw.config._resolve import (COMPUTE_SETTINGS, GPT_BLOCK, build_data,
                                   build_model, ints, used)
from lowbw.config._strategy_fields import (DEFAULT_STRATEGY, build_inner,
                                           fill, spec_of)
from lowbw.config._strategy_fields import TRACED as strategy_traced
from lowbw.config._strategy_fields import build as build_strategy

__all__ = ["COMPUTE_SETTINGS", "GPT_BLOCK", "DEFAULT_STRATEGY", "build_data", "build_inner", "build_model",
           "build_strategy", "fill", "ints", "spec_of", "strategy_traced", "used",
           "ALIASES", "Config", "FIELDS", "FORMATS", "Field", "GROUPS", "RUN",
           "SHAPE", "TRACED", "canonical", "check_value", "natural", "flag_kwargs", "read_config", "read_file"]

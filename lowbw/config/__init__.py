"""``lowbw.Config``: a whole run as one value, and its settings' table.

A ``Config`` is what ``lowbw train`` reads from flags and files, what every
run writes next to its logs (``config.yaml``), and what ``lowbw.simulate``,
``lowbw.build`` and ``lowbw.study`` take. This package sits below the
simulation package: it checks a run's settings (``_settings``: what a
compiled simulator is specialised to) and builds its strategy and network
once; ``lowbw.simulation`` builds and runs it.
"""

from lowbw.config._config import Config

__all__ = ["Config"]

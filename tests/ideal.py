"""The ideal link model (latency + bytes / bandwidth, no profile terms):
the tests that check the clock's formulas by hand build their networks with
it. The calibrated profile's terms (link efficiency, a cost per collective
call, a first-contact start-up, host time) have their own tests in
test_network_profile.py."""

import functools

from lowbw import network as _net

network = functools.partial(_net.network, profile="ideal")

"""Stage 3b, the judge: is a value inside the rounding spread of its own computation?

The worker simulates each arm's own rounding on the recorded graph
(`triage.worker.rounding`); this package reads that simulation in the parent and decides,
per observed value, where the arm's value falls:

* ``inside``   — among the simulated roundings (Monte Carlo p > α): rounding, whatever
                 float64 says;
* ``envelope`` — outside the unbiased spread but inside the directed replays (every op
                 rounded up / down): order-dependent, biased accumulation;
* ``outside``  — no rounding of this computation at the arm's precision gives it: a
                 different computation (a compiler bug, another formula, a precision mode).

`spread` turns the simulation into figures (significant digits, computational zero),
`decide` makes the call, and `describe` words it and draws it.
"""
from triage.judge.decide import ALPHA, judge_observable, judge_value
from triage.judge.spread import RoundingSpread

__all__ = ["ALPHA", "RoundingSpread", "judge_observable", "judge_value"]

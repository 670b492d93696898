"""Constants a formula is written with (√2, 1/√2, π, ln 2, …), by the name a maintainer reads:
the op graph's wording names a side's constant where it is one of these to 12 digits, the
worker's one-change search (triage/worker/counterfactual.py) tries one of these where a side
writes it to fewer digits, and a check against a value computed outside torch names such a
short constant the script writes (triage/classify/ladder.py)."""
from __future__ import annotations

import math

NAMED_CONSTANTS = {"√2": math.sqrt(2), "1/√2": 1 / math.sqrt(2), "π": math.pi, "1/π": 1 / math.pi,
                   "2/√π": 2 / math.sqrt(math.pi), "√(2/π)": math.sqrt(2 / math.pi), "√π": math.sqrt(math.pi),
                   "√(2π)": math.sqrt(2 * math.pi), "1/√(2π)": 1 / math.sqrt(2 * math.pi), "e": math.e,
                   "ln 2": math.log(2), "1/ln 2": 1 / math.log(2), "ln 10": math.log(10), "log10(e)": math.log10(math.e),
                   "2π": 2 * math.pi, "π/2": math.pi / 2, "ln(2π)": math.log(2 * math.pi),
                   "ln √(2π)": 0.5 * math.log(2 * math.pi), "Euler's γ": 0.5772156649015329}
# A written constant within this relative distance of a named one is read as that one, short.
NEAR_NAMED = 1e-3

"""The names both sides of the jail use for what crosses it, written once.

The parent (arms/run.py, arms/output.py, sandbox/zygote.py, judge/) and the worker import them from
here instead of keeping copies in step by comments. Imported by the worker before torch and by
the fork server before anything else, so it imports nothing at all.
"""
from __future__ import annotations

# The exit status of `python -m triage.worker` when run_job raised: its traceback went out as a
# `worker-error` message, which arms/run.py reads as triage's own failure, not the script's.
WORKER_ERROR_STATUS = 70

# The side file a minimal script loads its larger inputs from (render.py writes it beside
# minimal.py; a reporter's script that loads it has it staged beside it by arms/run.py).
INPUTS_FILE = "minimal_inputs.pt"
# The claim a script makes by reading back (or checking) its own error measure of two values,
# `(a - b).abs().max()`: that a and b should agree (triage/worker/observe.py records it).
DIFFERENCE_CLAIM = "max abs(a - b)"  # no "|": it is shown in markdown tables
# The same of a relative error measure, `((a - b) / b).abs().max()`, by its divisor.
RELATIVE_DIFFERENCE_CLAIMS = ("max abs((a - b) / a)", "max abs((a - b) / b)")
DIFFERENCE_CLAIMS = (DIFFERENCE_CLAIM,) + RELATIVE_DIFFERENCE_CLAIMS
# The label of an operand of an elementwise comparison the script turned into a Python bool or
# number, `(pred32 != pred16).sum().item()` (observe.py): what the script's check is about.
CHECKED_OPERAND = " in a check"

# values.npz: one array per observable index i, named PREFIX + str(i): the observed value, its
# float64 reference, and the rounding simulation's per-element spread (σ, the directed
# replays up and down, the samples' mean and sd, the nonfinite bits, the replay rounding to
# nearest), in that order.
OBSERVED, REFERENCE = "obs", "ref"
SPREAD_ARRAYS = ("sig", "up", "dn", "mu", "sd", "nf", "ct")
VALUE_ARRAYS = (OBSERVED, REFERENCE) + SPREAD_ARRAYS
# And one array per operand i of the script's failing check (result.json's `check_operands`),
# its values as float64: CHECK_OPERAND + str(i).
CHECK_OPERAND = "chk"

# The fork server (sandbox/zygote.py starts it, worker/zygote.py is it): the modules a job may
# run as `python -I -m MODULE`, and the module each one runs.
ENTRY_POINTS = {"triage.worker": "triage.worker.__main__", "triage.worker.serve": "triage.worker.serve"}
# The first descriptor a forked job's passed descriptors are renumbered to.
FIRST_JOB_FD = 3
# An empty directory the fork server's jail provides, where a job's mounts are staged.
STAGE = "/triage-stage"
# The warm-up's inductor cache folder under the fork server's HOME; triage copies the kept one in
# before it starts and out after it ends (caches.warm_up_cache).
WARM_UP_FOLDER = "inductor-warm-up"

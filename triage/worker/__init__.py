"""Code that runs *inside* an arm's subprocess, never in triage's own process.

The parent (`triage.arms.run`) starts `python -m triage.worker JOB.json` in a fresh, isolated
process per arm.  The worker imports torch, applies the arm's settings, runs the reporter's
script under three modes (device collapse, observation, op recording), replays the recorded
op graph in float64 on the CPU, and writes `result.json` + `values.npz` for the parent.
"""

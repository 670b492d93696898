"""Stage 2, the parent's side of one arm: Repro × ArmSpec → ArmRun.

    spec.py     what an arm is (device, mode, release, knobs) and the default arms
    run.py      run_arms: the job, the jail, deadlines, why an arm failed
    output.py   result.json and values.npz, checked field by field before they are believed
    graph.py    graph.json (the recorded op graph), read as untrusted: cones, plans

The worker that runs inside the arm is `triage.worker`; the jail is `triage.sandbox`.
"""

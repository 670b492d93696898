"""triage: run a PyTorch numerical-discrepancy repro on isolated arms, judge it against the
numerical accuracy policy with a float64 reference, and write the comment a maintainer needs.

Pipeline (one module per stage, plain data objects between them):

    extract.py   source file -> Repro
    run.py       Repro x arms -> ArmRun per arm  (isolated subprocesses: sandbox.py, worker/)
    compare.py   ArmRuns -> Comparison            (alignment, errors vs the float64 reference)
    classify.py  Comparison -> Verdict            (the policy ladder; policy.py holds the note)
    audit.py     Verdict -> Verdict               (checked against the raw evidence: conflicts -> inconclusive)
    report.py    Report -> comment.md, report.json, terminal view
    pipeline.py  the stages in order; cli.py is a thin shell around it
"""

__version__ = "0.1.0"

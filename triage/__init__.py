"""triage: run a PyTorch numerical-discrepancy repro on isolated arms, judge it against the
numerical accuracy policy with a float64 reference, and write the comment a maintainer needs.

Pipeline (a module or package per stage, plain data objects from model.py between them),
in the order pipeline.py runs them:

    1   extract.py    script file or issue body -> Repro
    2   arms/         Repro x arms -> ArmRun per arm: spec.py (what an arm is), run.py (a fresh
                      worker, worker/, in the jail, sandbox/), output.py (its result checked
                      before it is believed), graph.py (its recorded op graph, read as untrusted)
    2b  reported/     what the reporter's machine printed -> ReportedArm, judged on this one
    3   compare.py    ArmRuns -> Comparison: alignment, errors vs float64 (numerics/), the
                      script's own names (operands.py) and where two paths part (paths.py)
    3b  judge/        each side against the simulated rounding of its own computation
    4a  ablate.py     Comparison -> Ablations: the arms re-run with one switch changed
    4b  minimize/     Comparison -> a minimal op set and a verified standalone script
    5   classify/     Comparison + Ablations -> Verdict: ladder.py decides the rung, wording.py
                      writes it (policy.py holds the note)
    5b  audit.py      Verdict -> Verdict: checked against the raw evidence (inconclusive)
    6   report/       Report -> report.json (data.py), comment.md (comment.py) and the terminal
                      view (terminal.py), both read from report data through markdown.py
    7   github.py     GitHub: read an issue, upsert the bot's comment

pipeline.py runs the stages (settings.py holds every option once; reporter.py tells a
watcher how far it got); cli.py, the Action and sweep/ are shells around it. Shared by
the stages: model.py (the records between them), policy.py (PyTorch's accuracy note),
untrusted.py (reading what untrusted code wrote).
"""

__version__ = "0.1.0"

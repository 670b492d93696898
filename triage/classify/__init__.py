"""Stage 5: Comparison + Ablations → Verdict.

    ladder.py    which rung holds (`classify`), and the audit it passes through
    wording.py   each rung's sentences and evidence lines; the one Verdict builder
    facts.py     readings of the comparison that the ladder and the wording share
"""

"""Limits on what an arm's worker writes, shared by the worker (which keeps to them) and
triage's own process (`triage.arms.output`, which refuses a result that breaks them).

This module imports nothing: triage's process imports it without torch.
"""

# Entries of result.json's `leaves` and `conditioning` lists (and of report.json's, which
# copies them; templates/report.schema.json says the same). A script can create more leaf
# tensors than this (a loop of `torch.tensor([x])`): the worker keeps the ones the observed
# values read first, then the earliest, and says how many it left out.
MAX_LEAVES = 20_000
MAX_CONDITIONING = 100_000

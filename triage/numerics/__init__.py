"""numpy-only numerics that both sides of the jail import: `errors` (how far one array is from
another) and `literals` (float literals as triage's scripts write them). Nothing here imports
torch or a pipeline stage (tests/test_layers.py holds it to that)."""

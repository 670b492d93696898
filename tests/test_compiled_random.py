"""Which calls of a graph dynamo captures draw random numbers: a compiled region that does
has no float64 reference (a replay cannot draw the kernel's numbers)."""
import pytest
import torch
import torch.nn.functional as F
from torch import fx

from triage.worker.opgraph import _draws_random


def calls(fn) -> list[bool]:
    graph = fx.symbolic_trace(fn).graph
    return [_draws_random(n) for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("fn, draws", [
    (lambda x: F.dropout(x, 0.0, False), False),  # attention's dropout in eval mode
    (lambda x: F.dropout(x, 0.1, False), False),  # eval mode
    (lambda x: F.dropout(x, p=0.0, training=True), False),  # dropout=0.0
    (lambda x: F.dropout(x, 0.1, True), True),
    (lambda x: F.dropout(x), True),  # training by default
    (lambda x: F.dropout2d(x, 0.2, True), True),
    (lambda x: F.rrelu(x), False),  # fixed slope outside training
    (lambda x: F.rrelu(x, 0.1, 0.3, True), True),
    (lambda x: torch.randn_like(x), True),
    (lambda x: torch.exp(x), False),
])
def test_dropout_draws_only_where_it_drops(fn, draws):
    assert calls(fn) == [draws]


def test_a_probability_computed_in_the_graph_may_draw():
    # Only constants say a dropout draws nothing: a probability the graph computes may not be 0.
    assert calls(lambda x, p: F.dropout(x, p, True)) == [True]
    assert calls(lambda x, p: F.dropout(x, p, False)) == [False]  # eval mode: never

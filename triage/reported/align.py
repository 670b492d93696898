"""Line up the reporter's printed values with the values this machine's run printed, and
those with the observables that computed them.

The arm collapsed onto the CPU runs the reporter's program statement for statement, so it
prints the same lines in the same order with other numbers. Three passes, each stricter in
what it needs than the next is:

* ``line``    — whole printed lines whose skeletons (the text, values blanked) are equal, in
                order (difflib's longest matching blocks);
* ``segment`` — a reporter who joined several lines into one (`CPU: -inf; GPU: -108.3`): the
                pieces against this machine's lines or pieces, same skeleton, in order;
* ``order``   — what is left, where both sides have the same number of printed tensors
                (arrays, lists) left and nothing else, of the same sizes, in the same order
                (`CPU: tensor(-inf)` reported for a line that printed `tensor(-inf)`).

A printed value of this machine's run is tied to the observable (a readback, a call's output,
a name at exit) whose value prints as it, the first in program order after the last one
tied. What cannot be lined up is returned as such, never guessed.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import numpy as np

from triage.model import Observable
from triage.reported.printed import PLACEHOLDERS, PrintedGroup, PrintedNumber, PrintedRecord, flat_index


@dataclass
class Pair:
    reported: PrintedGroup
    record: PrintedRecord  # the reporter's record it is on
    here: PrintedGroup | None
    how: str | None
    context: str = ""  # the piece of the record it is in (`GPU: tensor(0.)` of `CPU: …; GPU: …`)


def pair_groups(reported: list[PrintedRecord], here: list[PrintedRecord]) -> list[Pair]:
    """Each reported value group with the group this machine printed in its place (or None)."""
    pairs: dict[int, Pair] = {}
    order = [(r, g) for r in reported for g in r.groups]
    key = {id(g): k for k, (_, g) in enumerate(order)}
    used_here: set[int] = set()

    def tie(rec: PrintedRecord, reported_groups: list[PrintedGroup], here_groups: list[PrintedGroup], how: str) -> None:
        for rg, hg in zip(reported_groups, here_groups, strict=False):
            if id(rg) in key and key[id(rg)] not in pairs and id(hg) not in used_here:
                pairs[key[id(rg)]] = Pair(rg, rec, hg, how)
                used_here.add(id(hg))

    matcher = difflib.SequenceMatcher(None, [r.skeleton for r in reported], [h.skeleton for h in here],
                                      autojunk=False)
    matched_reported, matched_here = set(), set()
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            r, h = reported[block.a + k], here[block.b + k]
            if len(r.groups) == len(h.groups):
                tie(r, r.groups, h.groups, "line")
                matched_reported.add(block.a + k)
                matched_here.add(block.b + k)
    # Pieces of what is left, on both sides, matched by skeleton in order.
    here_pieces = [(p, own) for j, h in enumerate(here) if j not in matched_here for p, own in h.segments() if own]
    cursor = 0
    for i, r in enumerate(reported):
        if i in matched_reported:
            continue
        for piece, own in r.segments():
            if not own:
                continue
            for j in range(cursor, len(here_pieces)):
                h, here_own = here_pieces[j]
                if _same_line(piece, h):
                    tie(r, own, here_own, "segment")
                    cursor = j + 1
                    break
    # What is left, in order, where both sides agree on kinds and sizes.
    left_reported = [(k, r, g) for k, (r, g) in enumerate(order) if k not in pairs]
    left_here = [g for h in here for g in h.groups if id(g) not in used_here]
    if left_reported and len(left_reported) == len(left_here) and all(
            _same_shape(g, h) for (_, _, g), h in zip(left_reported, left_here, strict=False)):
        for (k, r, g), h in zip(left_reported, left_here, strict=False):
            pairs[k] = Pair(g, r, h, "order")
    context = {id(g): piece.text for r in reported for piece, own in r.segments() for g in own}
    out = [pairs.get(k) or Pair(g, r, None, None) for k, (r, g) in enumerate(order)]
    for p in out:
        p.context = context.get(id(p.reported), p.record.text)
    return out


def _same_line(reported: PrintedRecord, here: PrintedRecord) -> bool:
    """The same printed line: equal skeletons, or the reporter's with words of their own
    after it (`GPU logdet: -108.3 (PyTorch 2.9.1, RTX 6000)`), where this machine's line
    names its value (a label, not a bare number)."""
    if reported.skeleton == here.skeleton:
        return len(reported.groups) == len(here.groups)
    labelled = any(word not in PLACEHOLDERS.values() and any(ch.isalpha() for ch in word) for word in here.skeleton.split())
    return labelled and reported.skeleton.startswith(here.skeleton + " ") and len(reported.groups) >= len(here.groups)


def _same_shape(a: PrintedGroup, b: PrintedGroup) -> bool:
    """Two printed tensors (arrays, lists) of as many numbers: a bare scalar has nothing but
    its label to be lined up by."""
    return {a.kind, b.kind} <= {"tensor", "array", "list"} and len(a.numbers) == len(b.numbers)


def find_observable(group: PrintedGroup, observables: list[Observable], after: int) -> tuple[Observable, list[int]] | None:
    """The observable whose value prints as `group` (this machine's printed numbers), and the
    flat position of each printed number in it: the first after index `after` in program
    order, else the first before it."""
    ordered = [o for o in observables if o.index > after] + [o for o in observables if o.index <= after]
    # A value the script read back (printed, .item()) before a call output or a name at exit.
    ordered.sort(key=lambda o: 0 if o.kind == "readback" else 1)
    for o in ordered:
        positions = _positions_in(group, o)
        if positions is not None:
            return o, positions
    return None


def positions_of(group: PrintedGroup, o: Observable) -> list[int] | None:
    """The flat position in `o`'s value of each number of `group`, where the group's shape
    fits the value's (None: it does not)."""
    if o.value is None or o.fingerprint is None or not group.numbers:
        return None
    value = np.asarray(o.value)
    if np.iscomplexobj(value) or value.dtype == np.bool_:
        return None
    shape = list(o.fingerprint.get("shape") or [])
    if group.kind == "scalar" and math.prod(shape) != 1:
        return None
    if group.kind != "scalar" and not group.elided and not group.truncated and len(group.numbers) != math.prod(shape):
        return None
    positions = [flat_index(n.index if group.kind != "scalar" else None, shape) for n in group.numbers]
    return None if any(at is None for at in positions) else positions


def _positions_in(group: PrintedGroup, o: Observable) -> list[int] | None:
    """`positions_of`, where every number also prints as the value's element there."""
    positions = positions_of(group, o)
    if positions is None:
        return None
    flat = np.asarray(o.value).reshape(-1).astype(np.float64)
    return positions if all(prints_as(flat[at], n) for n, at in zip(group.numbers, positions, strict=False)) else None


def prints_as(x: float, n: PrintedNumber) -> bool:
    """`x` prints as the number `n` (its interval, nan as nan, an infinity as itself)."""
    if math.isnan(n.value):
        return math.isnan(x)
    if math.isinf(n.value):
        return x == n.value
    # Printing rounds to nearest; the last digit may also be the printer's own rounding of a
    # float32 converted to decimal: a relative slack of one float64 unit.
    slack = 4 * math.ulp(max(abs(n.low), abs(n.high)))
    return n.low - slack <= x <= n.high + slack

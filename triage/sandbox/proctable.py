"""The host's process table, read from /proc: who is whose child, and how much memory each
holds. Both the sandboxed process (its whole tree's memory, killing what it left behind) and
the fork server (finding its children's host pids) read it.
"""
from __future__ import annotations

import collections
import os

_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, resident bytes, threads) for every process this user can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            # fields 4 (ppid), 20 (num_threads) and 24 (rss)
            table[int(entry)] = (int(fields[1]), int(fields[21]) * _PAGE, int(fields[17]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(root: int, table: dict[int, tuple[int, int, int]]) -> tuple[list[int], int]:
    """Every process under `root` (itself included) and their resident bytes together."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    found, stack, rss = [], [root], 0
    while stack:
        pid = stack.pop()
        if pid in table:
            found.append(pid)
            rss += table[pid][1]
        stack.extend(children.get(pid, ()))
    return found, rss

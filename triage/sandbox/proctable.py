"""The host's process table, read from /proc: who is whose child, how much memory each holds
and how much CPU time it has used. Both the sandboxed process (its whole tree's memory and
CPU time, killing what it left behind) and the fork server (finding its children's host pids)
read it.
"""
from __future__ import annotations

import collections
import os
from typing import NamedTuple

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class Task(NamedTuple):
    parent: int
    resident_bytes: int
    threads: int
    # User and system time of the process and of its children it has reaped: a pool worker's
    # time moves to its parent when it exits, so a tree's total does not drop.
    cpu_s: float


def process_table() -> dict[int, Task]:
    """pid -> its `Task` for every process this user can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            # fields 4 (ppid), 14-17 (utime, stime, cutime, cstime), 20 (num_threads), 24 (rss)
            table[int(entry)] = Task(int(fields[1]), int(fields[21]) * _PAGE, int(fields[17]),
                                     sum(int(x) for x in fields[11:15]) * _TICK_S)
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(root: int, table: dict[int, Task]) -> tuple[list[int], int]:
    """Every process under `root` (itself included) and their resident bytes together."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, task in table.items():
        children[task.parent].append(pid)
    found, stack, rss = [], [root], 0
    while stack:
        pid = stack.pop()
        if pid in table:
            found.append(pid)
            rss += table[pid].resident_bytes
        stack.extend(children.get(pid, ()))
    return found, rss

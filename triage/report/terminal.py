"""Stage 6's terminal view: report data → the rich summary `triage run` prints, read like the
comment from report.json's data and made `visible` first (never a terminal sequence).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from triage.report.markdown import visible_copy
from triage.report.views import LOCALIZATION_ROWS, localized_row, real, rounding_view


def render_terminal(data: dict[str, Any], console: Any) -> None:
    """The rich terminal summary of report data (`report_json`): verdict first, then the arms
    table and the evidence."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    def line(text: str) -> None:
        # A URL that rich breaks at the terminal's width no longer opens or pastes: a line
        # with one is left whole, for the terminal to wrap.
        console.print(text, markup=False, highlight=False, soft_wrap=True if "://" in text else None)

    data = visible_copy(data)  # what the script printed or raised, never a terminal sequence
    v = data["verdict"]
    colour = {True: "green", False: "red", None: "yellow"}[v["expected"]]
    expected = {True: "expected", False: "NOT expected", None: "undetermined"}[v["expected"]]
    # Inside the box the summary wraps (soft_wrap=False), whatever the console's default: a box
    # that cannot wrap crops it.
    console.print(Panel(f"[bold]{v['kind']}[/bold] ({expected})\n\n{escape(v['summary'])}",
                        title=f"triage: {data['repro']['name']}", border_style=colour), soft_wrap=False)
    isolation = data.get("isolation")
    if isolation and isolation["kind"] != "namespace":
        console.print(f"[bold red]isolation: {escape(isolation['detail'])}[/bold red]")
    runs = data.get("arms") or []
    if runs:
        observed = Counter(o.get("arm") for o in data.get("observables") or [])
        table = Table(title="arms")
        for col in ("arm", "status", "script s", "observed", "reference"):
            table.add_column(col)
        for r in runs:
            elapsed = real(r.get("elapsed_s"))
            table.add_row(r["spec"], escape(r["status"] if not r.get("failure") else f"{r['status']}: {r['failure']}"),
                          f"{elapsed:.2f}" if elapsed is not None else "—", str(observed[r["spec"]]),
                          (r.get("reference") or {}).get("status") or "—")
        console.print(table)
    for e in v["evidence"]:
        line(f" • {e}")
    _terminal_rounding(data, console)
    m = data.get("minimal")
    if m:
        state = "verified in fresh arms" if m["verified"] else "NOT verified: " + m["verification"]
        line(f"minimal repro: {len(m['ops'])} op(s) ({', '.join(m['ops'][:8])}) of {m['original_ops']}, "
             f"{m['queries']} queries, {m['seconds']:.1f} s, {state}")
        from rich.syntax import Syntax

        # Code is for copying: its lines are printed whole (a wrapped line no longer runs, a
        # cropped one loses code), highlighted text without a background to fill a width with.
        script = Syntax(m["script"], "python", background_color="default").highlight(m["script"])
        script.rstrip()
        console.print(script, soft_wrap=True)
    if data.get("ablations"):
        table = Table(title="ablations (one switch changed)")
        for col in ("switch", "arms", "result"):
            table.add_column(col)
        table.add_column("set with", overflow="fold")  # code: folded whole, never cut off with "…"
        for a in data["ablations"]:
            table.add_row(a["switch"], ", ".join(a["arms"]), escape(f"{a['outcome']}: {a['detail']}"),
                          escape(a["setting"]))
        console.print(table)
    if data.get("localization"):
        table = Table(title="where it diverges (top ops)")
        for col in ("op", "line", "role", "local error", "end to end"):
            table.add_column(col)
        for row in [localized_row(r) for r in data["localization"][:LOCALIZATION_ROWS]]:
            table.add_row(row["op"], row["line"], row["role"], row["local"], row["end_to_end"])
        console.print(table)
    for n in data.get("notes") or []:
        line(f" · {n}")
    line(f"policy: {v['policy_section']} {v['policy_url']}")
    if v.get("labels"):
        line("suggested labels: " + ", ".join(v["labels"]))


def _terminal_rounding(data: dict[str, Any], console: Any) -> None:
    """The rounding judgement as the comment shows it: a table, the strips, the rest as lines."""
    from rich.markup import escape
    from rich.table import Table

    view = rounding_view(data)
    if not view["rows"]:
        return
    divergence = (data.get("comparison") or {}).get("divergence") or {}
    table = Table(title="rounding judgement (each side against its own simulated rounding)")
    for col in ("arm", divergence.get("observable_label") or "value", "float64", "rounding spread", "p",
                "conclusion"):
        table.add_column(escape(col))
    for row in view["rows"]:
        arm = row["arm"] + (f" {row['label']}" if row["label"] else "")
        table.add_row(escape(arm), *(escape(row[k]) for k in ("value", "reference", "spread", "p", "conclusion")))
    console.print(table)
    for strip_picture in view["strips"]:
        console.print(strip_picture, markup=False, highlight=False, soft_wrap=True)
    for n in view["notes"]:
        console.print(f" • {n}", markup=False, highlight=False)
    for o in view["others"]:
        console.print(f" ◦ also judged: {o['arm']} {o['label']}: {o['result']}", markup=False, highlight=False)
    if view["others_left_out"]:
        console.print(f" ◦ … and {view['others_left_out']} more in report.json", markup=False, highlight=False)

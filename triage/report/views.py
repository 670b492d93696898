"""What the comment and the terminal show, read from report data (report.json's dict, never
live objects): the rounding judgement's rows and strips, the reported arm beside this run,
the ablation and localization rows. One reading for both renderers, so the terminal and the
comment cannot disagree.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from triage.judge.describe import spread_text
from triage.model import Judgement

LOCALIZATION_ROWS = 8
OTHER_JUDGEMENTS = 6  # lines for the other divergences' judged values; report.json has them all
ROUNDING_NOTES = 4  # unstable decisions and cancellation hints not already in the evidence


def reported_view(data: dict[str, Any]) -> dict[str, Any] | None:
    """The reported arm as the comment shows it: each posted value beside the value printed
    here and the spread it was judged by."""
    reported = data.get("reported")
    if not reported:
        return None
    rows = []
    for v in reported.get("values") or []:
        j = v.get("judgement") or {}
        judged = j.get("status") == "judged"
        row = _judgement_row(j) if judged else {"spread": "—", "reference": "—"}
        if judged and j.get("nonfinite") and real(j.get("reference")) is not None \
                and not math.isfinite(real(j.get("reference"))):
            row["spread"] = str(j["nonfinite"]).partition(": ")[2]  # no σ around an infinite value
        rows.append({"posted": v.get("printed") or "", "here": v.get("here") or "—",
                     "value": f"{v.get('label')} (line {v.get('line')})" if v.get("observable") is not None else "—",
                     "reference": row["reference"], "spread": row["spread"],
                     "conclusion": _zone_text(j).replace("its own rounding spread", "the modelled rounding spread")
                     if judged else f"not judged: {v.get('why') or j.get('reason') or 'no reason given'}"})
    return {"source": reported.get("source"), "device": reported.get("device"), "model": reported.get("model"),
            "rows": rows[:OTHER_JUDGEMENTS], "left_out": max(0, len(rows) - OTHER_JUDGEMENTS)}


def ablation_row(a: dict[str, Any]) -> dict[str, Any]:
    """An ablation as its row shows it: the arms the switch changed, named as they were compared
    (the row names the switch once: `cuda/compile/reduced_precision=off` repeats it and widens
    the table), or every arm where no arm names the switch (a float64 re-run of one op)."""
    suffix = "/" + a["switch"]
    changed = [spec.removesuffix(suffix) for spec in a["arms"] if spec.endswith(suffix)]
    return dict(a, arms=changed or a["arms"])


def localized_row(r: dict[str, Any]) -> dict[str, str]:
    return {"op": r["op"], "line": str(r["line"]) if r.get("line") is not None else "—",
            "role": ("first to differ; " if r.get("first") else "") + r["role"],
            "local": _errors(r.get("local")), "end_to_end": _errors(r.get("end_to_end"))}


def _errors(e: dict[str, Any] | None) -> str:
    if not e:
        return "—"
    if e["kind"] == "equal":
        return "bitwise equal"
    if e["kind"] in ("nonfinite", "raises"):
        return f"{e['kind']} ({e.get('detail')})"
    return f"{e['kind']}: {figure(e.get('max_ulps') or 0, '.3g')} ulp, abs {figure(e.get('max_abs') or 0, '.3g')}"


def rounding_view(data: dict[str, Any]) -> dict[str, Any]:
    """What the comment and the terminal show of the rounding judge, from report data: a row
    and a strip per side of the headline divergence, a capped list of the other judged values,
    and the unstable decisions and cancellation hints the verdict does not already quote."""
    comparison = data.get("comparison") or {}
    headline = (comparison.get("divergence") or {}).get("judgements") or []
    shown = {(j.get("arm"), j.get("observable")) for j in headline}
    others = []
    for d in comparison.get("others") or []:
        for j in d.get("judgements") or []:
            key = (j.get("arm"), j.get("observable"))
            if key not in shown:  # one value judged once, however many divergences it is part of
                shown.add(key)
                others.append(_other_line(j))
    v = data.get("verdict") or {}
    quoted = " ".join([v.get("summary") or ""] + list(v.get("evidence") or []))
    notes = [f"decision unstable under rounding (`{j.get('arm')}` {j.get('label')}): {u}"
             for j in headline for u in j.get("unstable") or [] if u not in quoted]
    notes += [line for hint, line in _cancellation_hints(data, headline) if hint not in quoted]
    # A claim compares two different values: each row then names its own.
    headline_label = (comparison.get("divergence") or {}).get("observable_label")
    rows = [dict(_judgement_row(j), label=str(j.get("label")) if j.get("label") != headline_label else "")
            for j in headline]
    return {"rows": rows,
            # The strip names only the arm: a claim's two values on one arm need their labels.
            "strips": [(f"{row['label']}:\n" if row["label"] else "") + j["strip"]
                       for j, row in zip(headline, rows, strict=False) if _drawable(j)],
            "others": others[:OTHER_JUDGEMENTS], "others_left_out": max(0, len(others) - OTHER_JUDGEMENTS),
            "notes": list(dict.fromkeys(notes))[:ROUNDING_NOTES]}
_JUDGEMENT_REALS = ("p", "statistic", "max_sample_stat", "value", "reference", "sigma", "digits")


def _as_judgement(j: dict[str, Any]) -> Judgement:
    """A judgement back from report data (floats written as "inf"/"nan" strings read back)."""
    known = {f.name for f in dataclasses.fields(Judgement)}
    fields = {k: (real(v) if k in _JUDGEMENT_REALS else v) for k, v in j.items() if k in known}
    return Judgement(**fields)


def real(x: Any) -> float | None:
    """A real from report data: a number, or one of the strings JSON writes inf and nan as."""
    if isinstance(x, str):
        return float(x) if x in ("inf", "-inf", "nan") else None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:  # an integer beyond float's range
        return math.copysign(math.inf, x)


def figure(x: Any, spec: str) -> str:
    """A real from report data formatted with `spec` ("inf" and "nan" too), "—" for anything else."""
    value = real(x)
    return "—" if value is None else format(value, spec)


def _number(x: Any) -> str:
    return figure(x, ".9g")


def _outside_by_nonfinite(j: dict[str, Any]) -> bool:
    return str(j.get("nonfinite") or "").startswith("outside")


def _drawable(j: dict[str, Any]) -> bool:
    """A strip says something only about a finite value on a finite, nonzero spread, and not
    when the side is outside because of nonfinite elements the strip cannot show."""
    value, sigma = real(j.get("value")), real(j.get("sigma"))
    return (j.get("status") == "judged" and bool(j.get("strip")) and value is not None and sigma is not None
            and math.isfinite(value) and math.isfinite(sigma) and sigma > 0 and not _outside_by_nonfinite(j))


def _judgement_row(j: dict[str, Any]) -> dict[str, str]:
    judged = j.get("status") == "judged"
    value = _number(j.get("value"))
    if judged and j.get("element") is not None and value != "—":
        value += f" (element {j['element']})"
    p = real(j.get("p"))
    p_text = f"{p:.2f} ({j.get('samples') or 0} samples)" if judged and p is not None else "—"
    if judged and p is not None and _outside_by_nonfinite(j):
        p_text += ", finite elements"
    return {"arm": str(j.get("arm")), "value": value if judged else "—",
            "reference": _number(j.get("reference")) if judged else "—",
            "spread": spread_text(_as_judgement(j)) if judged else "—", "p": p_text, "conclusion": _zone_text(j)}


# From this many σ at the element shown, an "inside" says how far its samples reach.
SAID_SIGMAS = 4.0


def _zone_text(j: dict[str, Any]) -> str:
    if j.get("status") != "judged":
        return f"not judged: {j.get('reason') or 'no reason given'}"
    if _outside_by_nonfinite(j):
        return "outside: " + str(j["nonfinite"]).removeprefix("outside: ")
    zone = j.get("zone")
    statistic, reach = real(j.get("statistic")), real(j.get("max_sample_stat"))
    if zone == "inside":
        # Many σ from float64 at the element shown, yet inside: the samples themselves reach
        # further (elements whose spread is narrow and whose samples are heavy-tailed).
        far = statistic is not None and reach is not None and math.isfinite(statistic) and statistic > SAID_SIGMAS
        return "inside its own rounding spread" + (f" ({statistic:.3g}σ here; its samples reach {reach:.3g}σ)"
                                                   if far else "")
    if zone == "envelope" and j.get("nearest") is True:
        return "rounding to nearest: outside the unbiased spread, where a replay rounding every op to nearest lands"
    if zone == "envelope":
        return "directed envelope: outside the unbiased spread, inside rounding all up / all down"
    if statistic is None or not math.isfinite(statistic):
        return "outside: where no simulated rounding moves it at all"
    return f"outside: {statistic:.3g}σ" + (f", the samples reach {reach:.3g}σ" if reach is not None else "")


def _other_line(j: dict[str, Any]) -> dict[str, str]:
    p = real(j.get("p"))
    if j.get("status") != "judged" or _outside_by_nonfinite(j):
        result = _zone_text(j)
    else:
        result = str(j.get("zone") or "?") + (f" (p = {p:.2f})" if p is not None else "")
    line = f" (line {j['line']})" if j.get("line") is not None else ""
    return {"arm": str(j.get("arm")), "label": str(j.get("label")) + line, "result": result}


def _cancellation_hints(data: dict[str, Any], headline: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(hint, line) for the rewrites the simulation suggests where the headline values lose
    digits upstream; the hint alone decides whether the verdict already quotes it."""
    wanted = {(j.get("arm"), j.get("observable")) for j in headline}
    out = []
    for o in data.get("observables") or []:
        if (o.get("arm"), o.get("index")) not in wanted:
            continue
        for site in (o.get("rounding") or {}).get("cancellations") or []:
            if not site.get("hint"):
                continue
            lost = site.get("digits_lost")
            lost = "every digit" if lost == "all" else f"{lost} digits" if isinstance(lost, (int, float)) else "digits"
            where = f" (line {site['line']})" if site.get("line") is not None else ""
            what = "absorption" if site.get("kind") == "absorbs" else "cancellation"
            out.append((site["hint"], f"{what} at `{site.get('op')}`{where} loses {lost}: {site['hint']}"))
    return out

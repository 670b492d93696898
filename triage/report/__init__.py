"""Stage 6: a Report → report.json, the GitHub comment and the terminal view.

    data.py       report.json and its closed schema (what `triage post` accepts)
    markdown.py   the escaping every string of report data goes through (also the sweep's)
    views.py      what the comment and the terminal show, read from report data
    comment.py    the comment (templates/comment.md.j2), its marker, digest and size caps
    terminal.py   the rich summary `triage run` prints

Both renderers read report data, never live objects: the Action's `triage post` renders a
report.json written by a job that ran untrusted code with the same code `triage run` uses.
"""

"""A screenshot of triage's GitHub comment as GitHub lays it out, taken with headless Chromium.

    python docs/comment_screenshot.py [REPORT.json] [--png docs/comment.png] [--html docs/comment.html]

The comment is rendered from REPORT.json by triage's own renderer (as `triage run --json`
writes it: a report.json exists, and the footer says so). Without REPORT.json, one is made by
running `triage run fixtures/compile_acosh.py`. markdown-it-py turns the comment into HTML the
way GitHub reads it (CommonMark with raw HTML, GFM tables and strikethrough), and the page lays
it out in a GitHub comment's 780 px column with the github-markdown-css rules that decide its
look and width. Nothing is fetched: the page uses the machine's own fonts.

Exit status: 0 done; 1 something in view is wider than the column, so GitHub would scroll it
sideways (each such table or code block is named on stderr; the screenshot is still written);
2 usage, no report, or Chromium missing or failing.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from markdown_it import MarkdownIt

from triage.report.comment import render_comment

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURE = ROOT / "fixtures" / "compile_acosh.py"
CHROMIUM = "/usr/bin/chromium"

# github-markdown-css (light theme), the rules that shape a comment: fonts and sizes, the
# spacing of blocks, tables as scrolling blocks with bordered cells, code on a grey ground,
# code blocks that scroll rather than wrap.
CSS = """
body { margin: 0; background: #fff; }
.comment { box-sizing: border-box; width: 780px; margin: 16px 60px; border: 1px solid #d1d9e0;
  border-radius: 6px; }
.comment-header { padding: 8px 16px; background: #f6f8fa; border-bottom: 1px solid #d1d9e0;
  border-radius: 6px 6px 0 0; color: #59636e;
  font: 14px -apple-system, BlinkMacSystemFont, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
.comment-header b { color: #1f2328; }
.markdown-body { padding: 16px; color: #1f2328; font-size: 14px; line-height: 1.5; word-wrap: break-word;
  font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
.markdown-body > *:first-child { margin-top: 0 !important; }
.markdown-body > *:last-child { margin-bottom: 0 !important; }
.markdown-body p, .markdown-body blockquote, .markdown-body ul, .markdown-body ol, .markdown-body table,
.markdown-body pre, .markdown-body details { margin-top: 0; margin-bottom: 16px; }
.markdown-body h3 { margin: 24px 0 16px; font-size: 1.25em; font-weight: 600; line-height: 1.25; }
.markdown-body blockquote { margin-left: 0; margin-right: 0; padding: 0 1em; color: #59636e;
  border-left: .25em solid #d1d9e0; }
.markdown-body a { color: #0969da; text-decoration: none; }
.markdown-body ul, .markdown-body ol { padding-left: 2em; }
.markdown-body li + li { margin-top: .25em; }
.markdown-body sub { font-size: 75%; }
.markdown-body summary { display: list-item; cursor: pointer; }
.markdown-body code, .markdown-body pre { font-size: 85%;
  font-family: ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", monospace; }
.markdown-body code { margin: 0; padding: .2em .4em; white-space: break-spaces;
  background-color: rgba(129, 139, 152, .12); border-radius: 6px; }
.markdown-body pre { padding: 16px; overflow: auto; line-height: 1.45; color: #1f2328; word-wrap: normal;
  background-color: #f6f8fa; border-radius: 6px; }
.markdown-body pre code { display: inline; padding: 0; font-size: 100%; white-space: pre; word-break: normal;
  background: transparent; border: 0; }
.markdown-body table { display: block; width: max-content; max-width: 100%; overflow: auto;
  border-spacing: 0; border-collapse: collapse; font-variant: tabular-nums; }
.markdown-body th { font-weight: 600; }
.markdown-body th, .markdown-body td { padding: 6px 13px; border: 1px solid #d1d9e0; }
.markdown-body tr { background-color: #fff; border-top: 1px solid #d1d9e0b3; }
.markdown-body tr:nth-child(2n) { background-color: #f6f8fa; }
"""

# Run by Chromium before it dumps the DOM: the page's height on <body data-height>, and what in
# view is wider than its box, as a JSON list on <body data-overflow>. Chromium lays out a closed
# <details> too (find-in-page opens it), so what is folded inside one, its summary aside, is
# left out here.
OVERFLOW_CHECK = """
const wide = [];
const folded = el => {
  const details = el.closest("details:not([open])");
  return details !== null && !details.querySelector(":scope > summary").contains(el);
};
for (const el of document.querySelectorAll(".markdown-body table, .markdown-body pre, .markdown-body")) {
  if (!folded(el) && el.scrollWidth > el.clientWidth + 1) {
    wide.push(`${el.tagName.toLowerCase()} ${el.scrollWidth} px wide in ${el.clientWidth} px: `
              + el.textContent.trim().replace(/\\s+/g, " ").slice(0, 80));
  }
}
document.body.dataset.overflow = JSON.stringify(wide);
document.body.dataset.height = document.documentElement.scrollHeight;
"""


def gfm_html(markdown: str) -> str:
    """`markdown` as HTML, read the way GitHub reads a comment: CommonMark with raw HTML, GFM
    tables and strikethrough, a newline in a paragraph as a line break."""
    gfm = MarkdownIt("commonmark", {"html": True, "breaks": True}).enable("table").enable("strikethrough")
    return gfm.render(markdown)


def comment_page(markdown: str, title: str) -> str:
    """A self-contained page showing the comment `markdown` in a GitHub comment's frame."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head>\n<body>\n<div class=\"comment\">"
            f"<div class=\"comment-header\"><b>triage-bot</b> commented</div>\n"
            f"<div class=\"markdown-body\">\n{gfm_html(markdown)}</div></div>\n"
            f"<script>{OVERFLOW_CHECK}</script>\n</body></html>\n")


def _chromium(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a fresh profile, nothing fetched, nothing synced."""
    with tempfile.TemporaryDirectory(prefix="triage-chromium-") as profile:
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


def screenshot(page: Path, png: Path, width: int, height: int, chromium: str = CHROMIUM) -> None:
    done = _chromium(chromium, f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri())
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{chromium} took no screenshot (exit {done.returncode}): {done.stderr[-2000:]}")


def layout(page: Path, width: int, chromium: str = CHROMIUM) -> tuple[int, list[str]]:
    """The height of the laid-out `page` in a window `width` px wide, and what in view is wider
    than its box (a table or code block that GitHub would scroll sideways)."""
    done = _chromium(chromium, f"--window-size={width},1000", "--dump-dom", page.resolve().as_uri())
    body = re.search(r"<body\b[^>]*>", done.stdout)
    attributes = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group())) if body else {}
    if done.returncode != 0 or set(attributes) != {"overflow", "height"}:
        raise RuntimeError(f"{chromium} dumped no laid-out page (exit {done.returncode}): {done.stderr[-2000:]}")
    return int(attributes["height"]), json.loads(html.unescape(attributes["overflow"]))


def report_from_fixture(folder: Path, fixture: Path = DEFAULT_FIXTURE) -> Path:
    """report.json of `triage run` on `fixture`, written into `folder`."""
    report = folder / "report.json"
    subprocess.run([sys.executable, "-m", "triage", "run", str(fixture), "--json", str(report),
                    "--comment", str(folder / "comment.md"), "--minimal", "-", "--quiet"],
                   cwd=folder, check=False)
    if not report.is_file():
        raise RuntimeError(f"triage run {fixture} wrote no report.json")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", type=Path,
                        help=f"report.json to render (default: `triage run {DEFAULT_FIXTURE.relative_to(ROOT)}`)")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "comment.png")
    parser.add_argument("--html", type=Path, default=ROOT / "docs" / "comment.html")
    parser.add_argument("--width", type=int, default=900, help="window width in px (the PNG's width)")
    parser.add_argument("--height", type=int, default=3000,
                        help="the PNG's height at most, in px (it is the page's own height where less)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or CHROMIUM)
    args = parser.parse_args(argv)
    if not os.access(args.chromium, os.X_OK):
        print(f"no Chromium at {args.chromium}: apt-get install chromium", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="triage-screenshot-") as folder:
            report = args.report or report_from_fixture(Path(folder))
            data = json.loads(report.read_text(encoding="utf-8"))
        markdown = render_comment(data, full_report="`report.json`")
        args.html.write_text(comment_page(markdown, f"triage comment: {data['repro']['name']}"), encoding="utf-8")
        height, wide = layout(args.html, args.width, args.chromium)
        screenshot(args.html, args.png, args.width, min(height, args.height), args.chromium)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {args.html} and {args.png}")
    for what in wide:
        print(f"wider than the comment column: {what}", file=sys.stderr)
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(main())

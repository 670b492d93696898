"""A small GitHub REST server on 127.0.0.1 for the publishing tests: the endpoints PyGithub
calls for triage (user, issue, comments list/create/edit, labels add/remove, issue search),
with tokens, comment authors, open/closed issues and pull requests, Link-header pagination,
and injected failures (a 502, a 403 rate limit with its reset) — so the tests exercise
PyGithub over real HTTP, not a mock of it.

To try posting by hand (the token `bot-token` posts as triage-bot):

    python -m tests.github_server --port 34207 --issue octo/demo#7=fixtures/issues/logdet_form.md --label 'bot: triage'
    GITHUB_TOKEN=bot-token triage issue octo/demo#7 --post --api-url http://127.0.0.1:34207/api/v3 --arms cpu
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit

PREFIX = "/api/v3"
SEARCH_RESULT_CAP = 1000  # GitHub's search serves only the first 1000 results of any query
# One search term: a qualifier `name:value` or `name:"value with spaces"`, a "quoted phrase", or
# a word. What is left unmatched is a stray double quote: GitHub refuses that query.
SEARCH_TERM = re.compile(r'(?P<name>[A-Za-z-]+):(?:"(?P<quoted>[^"]*)"|(?P<value>[^\s"]+))|"(?P<phrase>[^"]*)"|(?P<word>[^\s"]+)')


@dataclass
class Failure:
    method: str
    path: str  # regex on the path after /api/v3
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=lambda: {"message": "Server Error"})
    times: int = 1
    applied: bool = False  # do the request, then answer with the failure (a write that "failed" but happened)


class FakeGitHub:
    def __init__(self, port: int = 0) -> None:
        self.users = {"bot-token": "triage-bot", "mallory-token": "mallory"}
        self.issues: dict[tuple[str, int], dict[str, Any]] = {}
        self.comments: list[dict[str, Any]] = []
        self.failures: list[Failure] = []
        self.requests: list[tuple[str, str, int]] = []  # method, path, status
        self.lock = threading.Lock()
        self.next_id = 1000
        self.max_body = 65536
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{PREFIX}"

    def start(self) -> FakeGitHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_issue(self, repo: str, number: int, body: str, labels: list[str] = (), title: str = "numbers differ",
                  state: str = "open", pull_request: bool = False) -> None:
        """An issue (or, with `pull_request`, a pull request: GitHub serves both as issues)."""
        self.issues[(repo, number)] = {"repo": repo, "number": number, "title": title, "body": body,
                                       "labels": list(labels), "user": "reporter", "state": state,
                                       "pull_request": pull_request}

    def add_comment(self, repo: str, number: int, body: str, login: str) -> dict[str, Any]:
        with self.lock:
            self.next_id += 1
            comment = {"id": self.next_id, "repo": repo, "number": number, "body": body, "login": login}
            self.comments.append(comment)
            return comment

    def comments_on(self, repo: str, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments if c["repo"] == repo and c["number"] == number]

    def writes(self) -> list[tuple[str, str, int]]:
        return [r for r in self.requests if r[0] != "GET"]

    # -- JSON shapes PyGithub reads --------------------------------------------------------
    def _user(self, login: str) -> dict[str, Any]:
        return {"login": login, "id": abs(hash(login)) % 10**6, "type": "Bot" if login.endswith("[bot]") else "User"}

    def _issue_json(self, issue: dict[str, Any]) -> dict[str, Any]:
        repo_api = f"{self.api_url}/repos/{issue['repo']}"
        api = f"{repo_api}/issues/{issue['number']}"
        page = "pull" if issue["pull_request"] else "issues"
        data = {"id": issue["number"], "number": issue["number"], "title": issue["title"], "body": issue["body"],
                "state": issue["state"], "url": api, "repository_url": repo_api, "comments_url": api + "/comments",
                "html_url": f"https://github.example/{issue['repo']}/{page}/{issue['number']}",
                "user": self._user(issue["user"]),
                "labels": [{"name": n, "url": f"{repo_api}/labels/{n}"} for n in issue["labels"]]}
        if issue["pull_request"]:  # GitHub marks a pull request served as an issue by this key alone
            data["pull_request"] = {"url": f"{repo_api}/pulls/{issue['number']}", "html_url": data["html_url"]}
        return data

    def search(self, q: str) -> list[dict[str, Any]]:
        """The issues and pull requests `q` matches, in the order they were added, as GitHub's
        search reads it: qualifiers repo:, is:/state: open|closed, is:/type: issue|pr, label:
        (several are ANDed), sort: (ignored); every other word or "phrase" must appear in the
        title or body, case-insensitively. ValueError, with GitHub's reason, for a query GitHub
        refuses (and for a qualifier this server does not implement, rather than ignore it)."""
        if not q.strip():
            raise ValueError("The search query must not be empty.")
        if SEARCH_TERM.sub("", q).strip():
            raise ValueError(f"The search query has an unbalanced double quote: {q}")
        tests: list[Any] = []
        for m in SEARCH_TERM.finditer(q):
            name = (m.group("name") or "").lower()
            value = (m.group("quoted") if m.group("quoted") is not None else m.group("value") or "").lower()
            if name == "repo":
                if not any(repo.lower() == value for repo, _ in self.issues):
                    raise ValueError("The listed users and repositories cannot be searched either because the "
                                     "resources do not exist or you do not have permission to view them.")
                tests.append(lambda i, v=value: i["repo"].lower() == v)
            elif name in ("is", "state") and value in ("open", "closed"):
                tests.append(lambda i, v=value: i["state"] == v)
            elif name in ("is", "type") and value in ("issue", "pr", "pull-request"):
                tests.append(lambda i, pr=value != "issue": i["pull_request"] == pr)
            elif name == "label":
                tests.append(lambda i, v=value: v in (n.lower() for n in i["labels"]))
            elif name == "sort":
                continue
            elif name:
                raise ValueError(f"{m.group(0)}: the test server does not implement this qualifier")
            else:
                text = (m.group("phrase") if m.group("phrase") is not None else m.group("word")).lower()
                tests.append(lambda i, t=text: t in f"{i['title']}\n{i['body'] or ''}".lower())
        return [issue for issue in self.issues.values() if all(test(issue) for test in tests)]

    def _comment_json(self, c: dict[str, Any]) -> dict[str, Any]:
        return {"id": c["id"], "body": c["body"], "user": self._user(c["login"]),
                "url": f"{self.api_url}/repos/{c['repo']}/issues/comments/{c['id']}",
                "html_url": f"https://github.example/{c['repo']}/issues/{c['number']}#issuecomment-{c['id']}"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gh = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            override: Failure | None = None

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                if self.override is not None:
                    status, payload, headers, self.override = (self.override.status, self.override.body,
                                                               self.override.headers, None)
                data = b"" if payload is None else json.dumps(payload).encode()
                # Recorded before the answer leaves: the client may act on it (and a test count
                # the requests) before this thread runs again.
                with gh.lock:
                    gh.requests.append((self.command, self.path.split("?")[0].removeprefix(PREFIX), status))
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null") if n else None

            def _login(self) -> str | None:
                auth = self.headers.get("Authorization") or ""
                token = auth.split(" ", 1)[1] if " " in auth else None
                return gh.users.get(token) if token else None

            def _handle(self) -> None:
                url = urlsplit(self.path)
                path, query = unquote(url.path).removeprefix(PREFIX), parse_qs(url.query)
                body = self._body()
                for f in gh.failures:
                    if f.times > 0 and f.method == self.command and re.fullmatch(f.path, path):
                        f.times -= 1
                        if not f.applied:
                            return self._send(f.status, f.body, f.headers)
                        self.override = f
                        break
                login = self._login()
                if self.headers.get("Authorization") and login is None:
                    return self._send(401, {"message": "Bad credentials"})
                if path == "/user" and self.command == "GET":
                    return self._send(200, gh._user(login)) if login else self._send(401, {"message": "Requires authentication"})
                if path == "/search/issues" and self.command == "GET":
                    return self._search(url.query)
                m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/comments/(\d+)", path)
                if m and self.command == "PATCH":
                    comment = next((c for c in gh.comments if c["id"] == int(m.group(2))), None)
                    if comment is None:
                        return self._send(404, {"message": "Not Found"})
                    if comment["login"] != login:
                        return self._send(403, {"message": "Must have admin rights to Repository."})
                    if len(body["body"]) > gh.max_body:
                        return self._send(422, {"message": "Validation Failed", "errors": [{"message": "Body is too long"}]})
                    comment["body"] = body["body"]
                    return self._send(200, gh._comment_json(comment))
                m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/(\d+)(/comments|/labels(?:/(.+))?)?", path)
                issue = gh.issues.get((m.group(1), int(m.group(2)))) if m else None
                if issue is None:
                    return self._send(404, {"message": "Not Found"})
                tail = m.group(3)
                if tail is None and self.command == "GET":
                    return self._send(200, gh._issue_json(issue))
                if tail == "/comments" and self.command == "GET":
                    comments = gh.comments_on(issue["repo"], issue["number"])
                    per_page = int(query.get("per_page", ["30"])[0])
                    page = int(query.get("page", ["1"])[0])
                    chunk = comments[(page - 1) * per_page: page * per_page]
                    headers = {}
                    if page * per_page < len(comments):
                        nxt = f"{gh.api_url}/repos/{issue['repo']}/issues/{issue['number']}/comments?per_page={per_page}&page={page + 1}"
                        headers["Link"] = f'<{nxt}>; rel="next"'
                    return self._send(200, [gh._comment_json(c) for c in chunk], headers)
                if login is None:
                    return self._send(401, {"message": "Requires authentication"})
                if tail == "/comments" and self.command == "POST":
                    if len(body["body"]) > gh.max_body:
                        return self._send(422, {"message": "Validation Failed", "errors": [{"message": "Body is too long"}]})
                    comment = gh.add_comment(issue["repo"], issue["number"], body["body"], login)
                    return self._send(201, gh._comment_json(comment))
                if tail == "/labels" and self.command == "POST":
                    names = body["labels"] if isinstance(body, dict) else body
                    issue["labels"] += [n for n in names if n not in issue["labels"]]
                    return self._send(200, [{"name": n} for n in issue["labels"]])
                if tail and tail.startswith("/labels/") and self.command == "DELETE":
                    name = m.group(4)
                    if name not in issue["labels"]:
                        return self._send(404, {"message": "Label does not exist"})
                    issue["labels"].remove(name)
                    return self._send(200, [{"name": n} for n in issue["labels"]])
                return self._send(404, {"message": f"not implemented: {self.command} {path}"})

            def _search(self, raw_query: str) -> None:
                """GET /search/issues: one page of results, the Link header GitHub sends with it."""
                params = parse_qsl(raw_query, keep_blank_values=True)
                args = dict(params)
                try:
                    found = gh.search(args.get("q", ""))
                    per_page = min(100, max(1, int(args.get("per_page", "30"))))
                    page = max(1, int(args.get("page", "1")))
                except ValueError as e:
                    return self._send(422, {"message": "Validation Failed", "errors": [
                        {"message": str(e), "resource": "Search", "field": "q", "code": "invalid"}],
                        "documentation_url": "https://docs.github.com/v3/search/"})
                served = min(len(found), SEARCH_RESULT_CAP)
                if (page - 1) * per_page >= SEARCH_RESULT_CAP:
                    return self._send(422, {"message": "Only the first 1000 search results are available",
                                            "documentation_url": "https://docs.github.com/v3/search/"})
                chunk = found[(page - 1) * per_page: min(page * per_page, served)]
                items = [dict(gh._issue_json(issue), score=1.0) for issue in chunk]
                last = max(1, -(-served // per_page))

                def page_url(n: int) -> str:
                    kept = [(k, v) for k, v in params if k != "page"]
                    return f"{gh.api_url}/search/issues?{urlencode(kept + [('page', str(n))])}"

                # GitHub's order: prev, next, last, first; none of them on a single page.
                links = []
                if page > 1:
                    links.append(f'<{page_url(page - 1)}>; rel="prev"')
                if page < last:
                    links += [f'<{page_url(page + 1)}>; rel="next"', f'<{page_url(last)}>; rel="last"']
                if page > 1:
                    links.append(f'<{page_url(1)}>; rel="first"')
                headers = {"Link": ", ".join(links)} if links else {}
                return self._send(200, {"total_count": len(found), "incomplete_results": False, "items": items},
                                  headers)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        return Handler


def rate_limited(method: str, path: str, reset_in_s: float = 1.0) -> Failure:
    """GitHub's primary rate limit: 403, remaining 0, and the epoch second it resets."""
    return Failure(method, path, 403, {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0",
                                       "X-RateLimit-Reset": str(int(time.time() + reset_in_s))},
                   {"message": "API rate limit exceeded for installation."})


def main(argv: list[str] | None = None) -> None:
    """Serve issues from body files until interrupted; print every comment posted."""
    from triage.github import parse_issue_ref

    parser = argparse.ArgumentParser(prog="python -m tests.github_server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--issue", action="append", default=[], metavar="OWNER/REPO#N=BODY.md",
                        help="an issue and the markdown file holding its body (repeatable)")
    parser.add_argument("--label", action="append", default=[], help="a label every issue carries (repeatable)")
    args = parser.parse_args(argv)
    server = FakeGitHub(args.port)
    for spec in args.issue:
        ref, _, body_path = spec.partition("=")
        try:
            repo, number = parse_issue_ref(ref)
            with open(body_path, encoding="utf-8") as f:
                server.add_issue(repo, number, f.read(), labels=args.label)
        except (ValueError, OSError) as e:
            parser.error(f"--issue {spec}: {e}")
    print(f"GitHub API at {server.api_url} (token bot-token posts as triage-bot); Ctrl-C stops it", flush=True)
    seen = 0
    server.start()
    try:
        while True:
            time.sleep(0.5)
            for c in server.comments[seen:]:
                print(f"comment {c['id']} on {c['repo']}#{c['number']} by {c['login']}: {len(c['body'])} characters",
                      flush=True)
            seen = len(server.comments)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()

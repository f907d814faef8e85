"""A small Hub-compatible HTTP server for tests, spoken to by the real huggingface_hub client.

It implements the endpoints that token checks, repo creation and `upload_folder` use:
  GET  /api/whoami-v2
  POST /api/repos/create
  POST /api/validate-yaml                         (README.md front matter, checked before upload)
  GET  /api/models/{ns}/{name}[/revision/{rev}]
  GET  /api/models/{ns}/{name}/tree/{rev}
  POST /api/models/{ns}/{name}/preupload/{rev}
  POST /api/models/{ns}/{name}/commit/{rev}     (NDJSON: header / file / deletedFile lines)
Preupload answers "regular" for every file, so all content arrives base64-inline in the commit and the
client never needs the Xet or LFS storage protocols (the real Hub would answer "lfs" for weights).

State is kept in memory: users by token, repos (visibility, files as bytes, commits), and a switch to
fail the next N commits with a given HTTP status. Unknown routes answer 404 and are recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

REPO_ROUTE = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree|preupload|commit)/([^/]+))?/?$")


@dataclass
class User:
    name: str
    orgs: dict[str, str] = field(default_factory=dict)  # org name -> role in org
    token_role: str = "write"  # "read" | "write" | "fineGrained"
    fine_grained_write: list[str] = field(default_factory=list)  # entities with repo.write (fine-grained only)

    def whoami(self) -> dict[str, Any]:
        access: dict[str, Any] = {"displayName": "test token", "role": self.token_role}
        if self.token_role == "fineGrained":
            access["fineGrained"] = {
                "global": [],
                "scoped": [
                    {"entity": {"type": "user", "name": name}, "permissions": ["repo.content.read", "repo.write"]}
                    for name in self.fine_grained_write
                ],
            }
        return {
            "type": "user",
            "name": self.name,
            "fullname": self.name.title(),
            "orgs": [{"type": "org", "name": org, "roleInOrg": role} for org, role in self.orgs.items()],
            "auth": {"type": "access_token", "accessToken": access},
        }

    def can_write(self, namespace: str) -> bool:
        if self.token_role == "read":
            return False
        if self.token_role == "fineGrained" and namespace not in self.fine_grained_write:
            return False
        return namespace == self.name or self.orgs.get(namespace) in ("admin", "write", "contributor")

    def can_write_repo(self, repo: Repo) -> bool:
        """Org contributors may create repos but only write to the ones they created."""
        namespace = repo.repo_id.split("/")[0]
        if not self.can_write(namespace):
            return False
        return self.orgs.get(namespace) != "contributor" or repo.creator == self.name


@dataclass
class Repo:
    repo_id: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    creator: str = ""
    commits: list[str] = field(default_factory=list)

    @property
    def sha(self) -> str:
        return self.commits[-1] if self.commits else "0" * 40


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users: dict[str, User] = {}
        self.repos: dict[str, Repo] = {}
        self.fail_commits = 0
        self.fail_status = 500
        self.commit_attempts = 0
        self.unknown_routes: list[str] = []
        self.tokens_seen: set[str] = set()
        self.validated_cards: list[str] = []


class HubHandler(BaseHTTPRequestHandler):
    server: HubServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr access log
        pass

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def state(self) -> HubState:
        return self.server.state

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: Any = None, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload if payload is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, {"error": message, **extra}, headers)

    def _user(self) -> User | None:
        auth = self.headers.get("Authorization") or ""
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        if token:
            with self.state.lock:
                self.state.tokens_seen.add(token)
        return self.state.users.get(token)

    def _repo_visible(self, repo: Repo | None, user: User | None) -> bool:
        if repo is None:
            return False
        namespace = repo.repo_id.split("/")[0]
        return not repo.private or (user is not None and (namespace == user.name or namespace in user.orgs))

    # -- routes -----------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = urlparse(self.path).path
        if path == "/api/whoami-v2":
            return self._whoami()
        match = REPO_ROUTE.match(path)
        if match and match.group(2) in (None, "revision"):
            return self._repo_info(unquote(match.group(1)))
        if match and match.group(2) == "tree":
            return self._tree(unquote(match.group(1)))
        self._unknown()

    def do_POST(self) -> None:  # noqa: N802
        path = urlparse(self.path).path
        body = self._body()
        if path == "/api/repos/create":
            return self._create_repo(json.loads(body or b"{}"))
        if path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body or b"{}"))
        match = REPO_ROUTE.match(path)
        if match and match.group(2) == "preupload":
            return self._preupload(unquote(match.group(1)), json.loads(body or b"{}"))
        if match and match.group(2) == "commit":
            return self._commit(unquote(match.group(1)), body)
        self._unknown()

    def _unknown(self) -> None:
        with self.state.lock:
            self.state.unknown_routes.append(f"{self.command} {self.path}")
        self._error(404, f"test hub server has no route for {self.command} {urlparse(self.path).path}")

    def _whoami(self) -> None:
        user = self._user()
        if user is None:
            return self._error(401, "Invalid credentials in Authorization header")
        self._send(200, user.whoami())

    def _create_repo(self, payload: dict[str, Any]) -> None:
        user = self._user()
        if user is None:
            return self._error(401, "Invalid credentials in Authorization header")
        namespace = payload.get("organization") or user.name
        repo_id = f"{namespace}/{payload.get('name')}"
        if not user.can_write(namespace):
            return self._error(403, f"You don't have the rights to create a model under the namespace {namespace}")
        with self.state.lock:
            if repo_id in self.state.repos:
                # Like the Hub: the conflict answer carries the URL, which create_repo(exist_ok=True) returns.
                return self._error(409, "You already created this model repo", url=f"{self.server.endpoint}/{repo_id}")
            self.state.repos[repo_id] = Repo(repo_id, payload.get("visibility") == "private", creator=user.name)
        self._send(200, {"url": f"{self.server.endpoint}/{repo_id}", "name": repo_id, "id": repo_id})

    def _validate_yaml(self, payload: dict[str, Any]) -> None:
        """Like the Hub: the README's YAML front matter must parse to a mapping with known-shaped fields."""
        content = payload.get("content", "")
        match = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as exc:
            return self._send(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
        problems = [] if isinstance(metadata, dict) else ["metadata must be a mapping"]
        if isinstance(metadata, dict):
            for key in ("tags", "datasets"):
                if key in metadata and not isinstance(metadata[key], list | str):
                    problems.append(f'"{key}" must be a list of strings')
        if problems:
            return self._send(400, {"errors": [{"message": problem} for problem in problems]})
        with self.state.lock:
            self.state.validated_cards.append(content)
        self._send(200, {"warnings": []})

    def _repo_info(self, repo_id: str) -> None:
        repo = self.state.repos.get(repo_id)
        if not self._repo_visible(repo, self._user()):
            return self._error(404, "Repository not found", "RepoNotFound")
        siblings = [{"rfilename": name} for name in sorted(repo.files)]
        self._send(200, {"id": repo_id, "private": repo.private, "sha": repo.sha, "siblings": siblings})

    def _tree(self, repo_id: str) -> None:
        repo = self.state.repos.get(repo_id)
        if not self._repo_visible(repo, self._user()):
            return self._error(404, "Repository not found", "RepoNotFound")
        entries = [
            {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha1(data)}
            for name, data in sorted(repo.files.items())
        ]
        self._send(200, entries)

    def _writable_repo(self, repo_id: str) -> Repo | None:
        """The repo if this request may write to it; otherwise answers the request and returns None."""
        user = self._user()
        repo = self.state.repos.get(repo_id)
        if not self._repo_visible(repo, user):
            self._error(404, "Repository not found", "RepoNotFound")
            return None
        if user is None or not user.can_write_repo(repo):
            self._error(403, f"You don't have write access to {repo_id}")
            return None
        return repo

    def _preupload(self, repo_id: str, payload: dict[str, Any]) -> None:
        repo = self._writable_repo(repo_id)
        if repo is None:
            return
        files = []
        for item in payload.get("files", []):
            existing = repo.files.get(item["path"])
            oid = git_blob_sha1(existing) if existing is not None else None
            files.append({"path": item["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid})
        self._send(200, {"files": files, "commitOid": repo.sha})

    def _commit(self, repo_id: str, body: bytes) -> None:
        repo = self._writable_repo(repo_id)
        if repo is None:
            return
        with self.state.lock:
            self.state.commit_attempts += 1
            if self.state.fail_commits > 0:
                self.state.fail_commits -= 1
                return self._error(self.state.fail_status, "Internal error while committing (test server)")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        added: dict[str, bytes] = {}
        deleted: list[str] = []
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                deleted.append(value["path"])
            elif key != "header":
                return self._error(400, f"test hub server does not support commit lines of kind {key!r}")
        with self.state.lock:
            for name in deleted:
                repo.files.pop(name, None)
            repo.files.update(added)
            oid = hashlib.sha1(body).hexdigest()
            repo.commits.append(oid)
        url = f"{self.server.endpoint}/{repo_id}/commit/{oid}"
        self._send(200, {"success": True, "commitOid": oid, "commitUrl": url, "pullRequestUrl": None})


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.state = HubState()
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, name="test-hub", daemon=True)

    # -- test controls --------------------------------------------------------------------------
    def add_user(self, token: str, name: str, **kwargs: Any) -> User:
        user = User(name, **kwargs)
        self.state.users[token] = user
        return user

    def add_repo(self, repo_id: str, private: bool = False, files: dict[str, bytes] | None = None) -> Repo:
        repo = Repo(repo_id, private, dict(files or {}))
        self.state.repos[repo_id] = repo
        return repo

    def fail_next_commits(self, count: int, status: int = 500) -> None:
        self.state.fail_commits, self.state.fail_status = count, status

    def repo(self, repo_id: str) -> Repo:
        return self.state.repos[repo_id]

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)

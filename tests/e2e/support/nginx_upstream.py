"""A real nginx in the lab's upstream namespace: `git http-backend` (through fcgiwrap) under
`/git/`, and every other path answered 200 with what nginx routed on.

Every request nginx receives is one JSON line in `access.jsonl`: the method, the
request target as it arrived (`$request_uri`) and the path nginx routes on (`$uri`:
decoded, slashes merged, dot segments removed), so a test can compare the proxy's
reading of a path with the upstream's.

Pushes need `Authorization: Bearer <push_token>` (nginx answers 401 otherwise): the
credential a `transform` could inject. The repositories accept a push that carries it
(`http.receivepack`), so only the proxy stands between a push and the repository.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from e2e.support.lab import Lab, _terminate, run

GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

CONF = """
user root;
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp/body;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    proxy_temp_path {dir}/tmp/proxy;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    client_max_body_size 100m;
    log_format rec escape=json '{{"method":"$request_method","request_uri":"$request_uri","uri":"$uri",'
                               '"host":"$host","status":"$status","authorization":"$http_authorization",'
                               '"protocol":"$server_protocol"}}';
    server {{
        {listen}
        ssl_certificate {cert};
        ssl_certificate_key {key};
        access_log {dir}/access.jsonl rec;
        keepalive_requests 100000;

        location ~ ^/git(?<git_path>/.*)$ {{
            set $push "";
            if ($uri ~ "git-receive-pack$") {{ set $push "1"; }}
            if ($arg_service = "git-receive-pack") {{ set $push "1"; }}
            if ($http_authorization = "Bearer {push_token}") {{ set $push "${{push}}ok"; }}
            if ($push = "1") {{ return 401; }}
            fastcgi_pass unix:{dir}/fcgi.sock;
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME {backend};
            fastcgi_param GIT_PROJECT_ROOT {dir}/repos;
            fastcgi_param GIT_HTTP_EXPORT_ALL "";
            fastcgi_param PATH_INFO $git_path;
            fastcgi_param REMOTE_USER pusher;
        }}
        location / {{
            default_type application/json;
            return 200 '{{"uri":"$uri"}}';
        }}
    }}
}}
"""


class NginxUpstream:
    def __init__(self, lab: Lab, name: str, addresses: list[str], https_port: int, http_port: int, push_token: str):
        self.lab = lab
        self.dir = lab.dir / name
        self.addresses = addresses
        self.https_port, self.http_port = https_port, http_port
        self.push_token = push_token
        self.log = self.dir / "access.jsonl"
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> NginxUpstream:
        self.dir.mkdir()
        (self.dir / "tmp").mkdir()
        (self.dir / "repos").mkdir()
        listen = " ".join(
            f"listen {a}:{self.https_port} ssl http2; listen {a}:{self.http_port};" for a in self.addresses
        )
        (self.dir / "nginx.conf").write_text(
            CONF.format(
                dir=self.dir, listen=listen, cert=self.lab.dir / "upstream.pem", key=self.lab.dir / "upstream.key",
                push_token=self.push_token, backend=GIT_HTTP_BACKEND,
            )
        )  # fmt: skip
        ns = ["ip", "netns", "exec", self.lab.upstream_ns]
        sock = self.dir / "fcgi.sock"
        # Each in a process group of its own: fcgiwrap's forked workers (and nginx's) are
        # stopped with their parent, not left running after the test.
        self._procs.append(subprocess.Popen([*ns, "fcgiwrap", "-c", "4", "-s", f"unix:{sock}"], start_new_session=True))
        self._procs.append(
            subprocess.Popen(
                [*ns, "nginx", "-c", str(self.dir / "nginx.conf"), "-e", str(self.dir / "error.log")],
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 10
        while not (sock.exists() and self.lab.exec("true").returncode == 0 and self._listening()):
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"nginx did not start: {(self.dir / 'error.log').read_text()}")
            time.sleep(0.1)
        return self

    def _listening(self) -> bool:
        out = run(["ip", "netns", "exec", self.lab.upstream_ns, "ss", "-ltnH"], check=False).stdout
        return f":{self.https_port} " in out

    def __exit__(self, *exc) -> None:
        for proc in reversed(self._procs):  # only what this started: its process group, by PID
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            _terminate(proc)

    # -- repositories ------------------------------------------------------------------
    def make_repo(self, name: str) -> Path:
        """A bare repository with one commit on `main`, served at /git/NAME."""
        env = {**os.environ, **GIT_ENV}
        work = self.dir / f"{name}-work"
        run(["git", "init", "-q", "-b", "main", str(work)], env=env)
        (work / "README").write_text(f"{name}: hello through the proxy\n")
        run(["git", "-C", str(work), "add", "README"], env=env)
        run(["git", "-C", str(work), "commit", "-q", "-m", "init"], env=env)
        bare = self.dir / "repos" / name
        run(["git", "clone", "-q", "--bare", str(work), str(bare)], env=env)
        run(["git", "-C", str(bare), "config", "http.receivepack", "true"], env=env)
        run(["git", "-C", str(bare), "update-server-info"], env=env)
        return bare

    def add_commit(self, bare: Path, text: str) -> str:
        """A new commit on the server side (for `git fetch` to bring)."""
        env = {**os.environ, **GIT_ENV}
        work = self.dir / f"{bare.name}-work"
        (work / "README").write_text(text)
        run(["git", "-C", str(work), "commit", "-q", "-am", text], env=env)
        run(["git", "-C", str(work), "push", "-q", str(bare), "main"], env=env)
        return head(bare)

    # -- what nginx received -----------------------------------------------------------
    def received(self) -> list[dict]:
        if not self.log.exists():
            return []
        # Only complete lines: nginx may be writing the last one while it is read.
        complete = self.log.read_text().split("\n")[:-1]
        return [json.loads(line) for line in complete if line]

    def mark(self) -> int:
        return len(self.received())

    def since(self, mark: int, expect: int = 0) -> list[dict]:
        """Lines logged after `mark`; waits (2 s at most) for `expect` of them: nginx writes
        its line once the request is finished, which can be just after the client has the answer."""
        deadline = time.monotonic() + 2
        while len(lines := self.received()[mark:]) < expect and time.monotonic() < deadline:
            time.sleep(0.05)
        return lines


def head(bare: Path) -> str:
    return run(["git", "-C", str(bare), "rev-parse", "refs/heads/main"]).stdout.strip()


def refs(bare: Path) -> str:
    """Every ref and object count of a bare repository: what a push would change."""
    listed = run(["git", "-C", str(bare), "for-each-ref"]).stdout
    objects = run(["git", "-C", str(bare), "count-objects", "-v"]).stdout
    return listed + objects

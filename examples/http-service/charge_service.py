#!/usr/bin/env python3
"""A team's charge service behind the dedup-console HTTP gateway: Python 3, standard library only.

POST /charge with a JSON body {"orderNo": ..., "amountCents": ...} books one charge in the
service's own SQLite table, keyed by the request's Idempotency-Key (the message id, sent by the
gateway as an RFC 8941 sf-string). The key is honoured as draft-ietf-httpapi-idempotency-key-header
describes it:

- a new key: the charge is booked, and its answer stored with the key in the same transaction;
- a key whose first request is still being worked on: 409 (the gateway tries again later without
  counting an attempt);
- a key already answered: the first answer again, byte for byte (Idempotent-Replayed: true);
- a key that comes back with another payload: 422 (the gateway makes it a dead letter);
- no key, or one that does not parse: 400.

A key held by a process that has since died (killed mid-charge) is taken over by the next request:
its charge never committed, since the charge and the stored answer commit together.

For trying the gateway out, the service can be told to misbehave, at start (CHARGE_MODE) or while
it runs (POST /admin/mode {"mode": "..."}):

- ok:     normal service (the default);
- fail:   refuse every charge with 402 "card declined" (a permanent refusal: dead letters);
- error:  answer 500 (retried by the gateway with back-off);
- hang:   take each new charge, hold it for CHARGE_HANG_SECONDS (default 30), then book it:
          longer than the gateway's timeout, so its retries meet 409 until the charge is done.

Injected failures (fail, error) are answered before the key is looked at: they store nothing.

With a Standard Webhooks secret (CHARGE_WEBHOOK_SECRET, `whsec_` + base64, the gateway's
`signing_secret`), a call whose webhook-signature does not check out, or whose webhook-timestamp
is more than 5 minutes away, gets 401.

Other endpoints: GET /charges (the booked charges, JSON), GET /health, GET /admin/mode.
Run one process per database file (it tells its own in-flight keys from a dead process's).
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("ok", "fail", "error", "hang")
SIGNATURE_TOLERANCE_SECONDS = 5 * 60
MAX_BODY_BYTES = 1 << 20

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,              -- SHA-256 of the body: a reused key is told apart
    owner        TEXT NOT NULL,              -- the process working on it, or that answered it
    status       INTEGER,                    -- NULL while in flight
    answer       TEXT,                       -- the first answer's body, replayed after
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE IF NOT EXISTS charges (
    id              INTEGER PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE REFERENCES idempotency_keys (key),
    order_no        TEXT NOT NULL,
    amount_cents    INTEGER NOT NULL,
    charged_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
"""


class KeyError400(ValueError):
    """An Idempotency-Key that is missing or does not parse."""


def parse_idempotency_key(value):
    """The key of an Idempotency-Key header value: an RFC 8941 sf-string ("..." with \\" and \\\\
    escapes), or the RFC 9651 Display String (%"...", UTF-8 percent-encoded) the gateway sends for
    a message id outside printable ASCII. Parameters after the item (;a=1) are ignored.

    Raises KeyError400 when the value is neither.
    """
    if value is None:
        raise KeyError400("no Idempotency-Key header")
    text = value.strip(" \t")
    display = text.startswith('%"')
    i = 2 if display else 1
    if not (display or text.startswith('"')):
        raise KeyError400("Idempotency-Key must be an sf-string (RFC 8941): a quoted string")
    out = bytearray()
    while i < len(text):
        c = text[i]
        i += 1
        if not 0x20 <= ord(c) <= 0x7E:
            raise KeyError400("Idempotency-Key holds a character outside printable ASCII")
        if c == '"':
            rest = text[i:].strip(" \t")
            if rest and not rest.startswith(";"):
                raise KeyError400("Idempotency-Key has text after its closing quote")
            key = out.decode("utf-8") if display else out.decode("ascii")
            if not key:
                raise KeyError400("Idempotency-Key is empty")
            return key
        if not display and c == "\\":
            if i >= len(text) or text[i] not in '"\\':
                raise KeyError400("Idempotency-Key has a \\ that escapes neither \" nor \\")
            out += text[i].encode()
            i += 1
        elif display and c == "%":
            pair = text[i:i + 2]
            if len(pair) != 2 or any(h not in "0123456789abcdef" for h in pair):
                raise KeyError400("Idempotency-Key has a % not followed by two lowercase hex digits")
            out.append(int(pair, 16))
            i += 2
        else:
            out += c.encode()
    raise KeyError400("Idempotency-Key has no closing quote")


def webhook_key(secret):
    """The HMAC key of a Standard Webhooks secret: base64 after the optional whsec_ prefix."""
    encoded = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    key = base64.b64decode(encoded, validate=True)
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def signature_problem(key, headers, body, now=None):
    """Why a call's Standard Webhooks signature does not check out, or None when it does."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        return "webhook-id, webhook-timestamp and webhook-signature are required"
    try:
        sent = int(timestamp)
    except ValueError:
        return "webhook-timestamp is not an integer"
    if abs((now or time.time()) - sent) > SIGNATURE_TOLERANCE_SECONDS:
        return "webhook-timestamp is more than 5 minutes away"
    signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return None
    return "no webhook-signature matches"


class ChargeService:
    """The charge logic over one SQLite file; safe to call from many threads."""

    def __init__(self, db_path, mode="ok", hang_seconds=30.0, work_ms=0, webhook_secret=None):
        self.db_path = db_path
        self.owner = uuid.uuid4().hex  # this process: a key another owner holds in flight is abandoned
        self.lock = threading.Lock()
        self.mode = mode
        self.hang_seconds = hang_seconds
        self.work_ms = work_ms
        self.webhook_key = webhook_key(webhook_secret) if webhook_secret else None
        with closing(self.connect()) as db:
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(SCHEMA)

    def connect(self):
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        db.execute("PRAGMA busy_timeout = 30000")
        return db

    def set_mode(self, mode, hang_seconds=None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        with self.lock:
            self.mode = mode
            if hang_seconds is not None:
                self.hang_seconds = float(hang_seconds)

    def current_mode(self):
        with self.lock:
            return {"mode": self.mode, "hang_seconds": self.hang_seconds}

    def charge(self, headers, body):
        """Answers one POST /charge: (status, JSON body as a string, extra headers)."""
        if self.webhook_key is not None:
            problem = signature_problem(self.webhook_key, headers, body)
            if problem:
                return answer(401, {"error": f"signature: {problem}"})
        mode = self.current_mode()
        if mode["mode"] == "fail":
            return answer(402, {"error": "card declined (mode fail)"})
        if mode["mode"] == "error":
            return answer(500, {"error": "internal error (mode error)"})
        try:
            key = parse_idempotency_key(headers.get("idempotency-key"))
        except KeyError400 as e:
            return answer(400, {"error": str(e)})
        try:
            request = json.loads(body)
            order_no = str(request["orderNo"])
            amount = request["amountCents"]
            if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
                raise ValueError("amountCents must be a positive integer")
        except (ValueError, KeyError, TypeError) as e:
            return answer(400, {"error": f"the body must be JSON with orderNo and amountCents: {e}"})
        request_hash = hashlib.sha256(body).hexdigest()

        db = self.connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT request_hash, owner, status, answer FROM idempotency_keys WHERE key = ?", (key,)
            ).fetchone()
            if row is not None:
                stored_hash, owner, status, stored = row
                if stored_hash != request_hash:
                    db.execute("ROLLBACK")
                    return answer(422, {"error": "this Idempotency-Key was used with another payload"})
                if status is not None:
                    db.execute("ROLLBACK")
                    return status, stored, {"Idempotent-Replayed": "true"}
                if owner == self.owner:
                    db.execute("ROLLBACK")
                    return answer(409, {"error": "a request with this Idempotency-Key is in progress"},
                                  {"Retry-After": "1"})
                # In flight for a process that is gone: its charge never committed; take it over.
                db.execute("UPDATE idempotency_keys SET owner = ? WHERE key = ?", (self.owner, key))
            else:
                db.execute("INSERT INTO idempotency_keys (key, request_hash, owner) VALUES (?, ?, ?)",
                           (key, request_hash, self.owner))
            db.execute("COMMIT")

            delay = mode["hang_seconds"] if mode["mode"] == "hang" else self.work_ms / 1000
            if delay > 0:
                time.sleep(delay)

            db.execute("BEGIN IMMEDIATE")
            cursor = db.execute("INSERT INTO charges (idempotency_key, order_no, amount_cents) VALUES (?, ?, ?)",
                                (key, order_no, amount))
            status, stored, _ = answer(201, {"chargeId": cursor.lastrowid, "orderNo": order_no,
                                             "amountCents": amount})
            db.execute("UPDATE idempotency_keys SET status = ?, answer = ? WHERE key = ?", (status, stored, key))
            db.execute("COMMIT")
            return status, stored, {}
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            # Let a retry take the key again: nothing of this request committed but the claim.
            with closing(self.connect()) as cleanup:
                cleanup.execute("DELETE FROM idempotency_keys WHERE key = ? AND owner = ? AND status IS NULL",
                                (key, self.owner))
            raise
        finally:
            db.close()

    def charges(self):
        with closing(self.connect()) as db:
            rows = db.execute(
                "SELECT id, idempotency_key, order_no, amount_cents, charged_at FROM charges ORDER BY id"
            ).fetchall()
        fields = ("chargeId", "idempotencyKey", "orderNo", "amountCents", "chargedAt")
        return [dict(zip(fields, row)) for row in rows]


def answer(status, body, headers=None):
    return status, json.dumps(body), headers or {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the gateway pools its connections
    service: ChargeService = None

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.send(413, json.dumps({"error": "body too large"}))
            return
        body = self.rfile.read(length)
        if self.path == "/charge":
            headers = {name.lower(): value for name, value in self.headers.items()}
            status, text, extra = self.service.charge(headers, body)
            key = self.headers.get("Idempotency-Key")
            attempt = self.headers.get("Dedup-Attempt")
            print(f"POST /charge key={key} attempt={attempt} -> {status}"
                  f"{' (replayed)' if extra.get('Idempotent-Replayed') else ''}", flush=True)
            self.send(status, text, extra)
        elif self.path == "/admin/mode":
            try:
                request = json.loads(body or b"{}")
                self.service.set_mode(request.get("mode"), request.get("hang_seconds"))
            except (ValueError, AttributeError, TypeError) as e:
                self.send(400, json.dumps({"error": str(e)}))
                return
            print(f"mode: {self.service.current_mode()}", flush=True)
            self.send(200, json.dumps(self.service.current_mode()))
        else:
            self.send(404, json.dumps({"error": "not found"}))

    def do_GET(self):
        if self.path == "/charges":
            self.send(200, json.dumps(self.service.charges()))
        elif self.path == "/health":
            self.send(200, json.dumps({"status": "ok"}))
        elif self.path == "/admin/mode":
            self.send(200, json.dumps(self.service.current_mode()))
        else:
            self.send(404, json.dumps({"error": "not found"}))

    def send(self, status, text, headers=None):
        data = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway gave up waiting (its timeout); the answer is stored for its retry

    def log_message(self, format, *args):
        pass  # one line per charge is printed by do_POST


def main():
    parser = argparse.ArgumentParser(description="A charge service behind the dedup-console HTTP gateway.")
    parser.add_argument("--host", default=os.environ.get("CHARGE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("CHARGE_PORT", "8080")))
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "charges.sqlite3")
    parser.add_argument("--db", default=os.environ.get("CHARGE_DB", beside),
                        help="the SQLite file (created if missing); default charges.sqlite3 beside this script")
    parser.add_argument("--mode", choices=MODES, default=os.environ.get("CHARGE_MODE", "ok"))
    args = parser.parse_args()
    service = ChargeService(
        args.db,
        mode=args.mode,
        hang_seconds=float(os.environ.get("CHARGE_HANG_SECONDS", "30")),
        work_ms=int(os.environ.get("CHARGE_WORK_MS", "0")),
        webhook_secret=os.environ.get("CHARGE_WEBHOOK_SECRET") or None,
    )
    Handler.service = service
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    signed = "checked" if service.webhook_key else "not checked"
    print(f"charge service on http://{args.host}:{server.server_port} (db {args.db}, mode {args.mode}, "
          f"signatures {signed})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())

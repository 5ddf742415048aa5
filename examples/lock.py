#!/usr/bin/env python3
"""Take a fencegate lock, write through the sidecar with its fencing token,
release it: a client in another language, written from the shapes of
docs/openapi.yaml alone (a node serves it at GET /v1/openapi.yaml), with
Python's standard library.

Against `fencegate dev` (lock service :7401, sidecar :8080):

    python3 examples/lock.py
    python3 examples/lock.py --lock http://127.0.0.1:7402 --rack 7

Exit status: 0 when every step answered as the document says it should; 75
if the rack's lock was held past --wait-ms; 1 otherwise.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid


def call(method, url, body=None, headers=None):
    """(status, decoded JSON body or text) of one request; refusals too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, decode(answer)
    except urllib.error.HTTPError as refusal:
        return refusal.code, decode(refusal)


def decode(answer):
    text = answer.read().decode()
    if answer.headers.get_content_type() == "application/json":
        return json.loads(text)
    return text


class LockService:
    def __init__(self, url, token=None):
        self.url = url.rstrip("/")
        # The document's `bearer` scheme; a loopback node without auth needs none.
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def acquire(self, key, ttl_ms, wait_ms, holder):
        """`Granted`, or None if `Held`. A 503 (`no_leader`/`unavailable`)
        leaves the outcome unknown: the retry carries the same
        `request_id`, so it gets the first grant back instead of a second."""
        # Every character percent-encoded, as generated clients do: the
        # node decodes the key once.
        path = "/v1/locks/" + urllib.parse.quote(key, safe="")
        request = {"ttl_ms": ttl_ms, "wait_ms": wait_ms, "holder": holder, "request_id": uuid.uuid4().hex}
        for attempt in range(5):
            status, body = call("POST", self.url + path, request, self.headers)
            if status == 200:
                return body  # {"key", "token", "lease_id", "ttl_ms"}
            if status == 409 and body["error"] == "held":
                return None
            if status != 503:
                raise RuntimeError(f"acquire {key}: {status} {body}")
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"acquire {key}: no leader after 5 tries, last {body}")

    def release(self, lease_id):
        """`Released`; 404 `lease_not_found` if the lease had already ended."""
        return call("DELETE", f"{self.url}/v1/leases/{lease_id}", headers=self.headers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", default="http://127.0.0.1:7401", help="any node's client API")
    parser.add_argument("--sidecar", default="http://127.0.0.1:8080", help="the sidecar in front of the inventory API")
    parser.add_argument("--rack", default="42")
    parser.add_argument("--wait-ms", type=int, default=10000)
    parser.add_argument("--token", default=os.environ.get("FENCEGATE_TOKEN"), help="default: $FENCEGATE_TOKEN")
    args = parser.parse_args()

    locks = LockService(args.lock, args.token)
    key = f"rack/{args.rack}"
    rack = f"{args.sidecar.rstrip('/')}/racks/{args.rack}"

    def take(who):
        lease = locks.acquire(key, ttl_ms=10000, wait_ms=args.wait_ms, holder=f"{who}:{os.getpid()}")
        if lease is not None:
            print(f"{who}: acquired {lease['key']}, token {lease['token']}, ttl {lease['ttl_ms']} ms")
        return lease

    def write(who, lease, state):
        # The token travels to the resource; the lease id stays here.
        status, body = call("PUT", rack, {"state": state}, {"X-Fence-Token": str(lease["token"])})
        shown = body.get("error", body) if isinstance(body, dict) else body.strip()
        print(f"{who}: PUT /racks/{args.rack} with X-Fence-Token {lease['token']} -> {status} {shown}")
        return status

    def release(who, lease):
        status, body = locks.release(lease["lease_id"])
        print(f"{who}: released -> {status} {body}")
        return status == 200 and body["released"] is True

    first = take("first")
    if first is None:
        print(f"{key} is held: not obtained within {args.wait_ms} ms", file=sys.stderr)
        return 75
    ok = write("first", first, "drained") == 200 and release("first", first)
    # The next holder's grant has a larger token: once the sidecar has seen
    # it, the first token is stale and its late write never reaches the API.
    second = take("second")
    if second is None:
        return 75
    ok &= write("second", second, "flashed") == 200
    ok &= write("first", first, "late-write") == 409
    ok &= release("second", second)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

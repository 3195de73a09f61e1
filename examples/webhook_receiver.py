"""A webhook receiver for airflow-gpu's notifications (docs/notifications.md): checks
each POST's signature with the team's secret, drops deliveries it has seen (by delivery
id), prints one line per notification and answers 200 (401 for a bad signature).

    python3 examples/webhook_receiver.py --port 9000 --secret-file webhook.secret

The secret file holds what `airflow-gpu team-set TEAM --webhook-secret new` printed; it
is read again for every request, so a rotated secret takes effect at once. The signature
covers the URL the service POSTed to: this receiver's `--base-url` (default
http://HOST:PORT; behind a proxy, the public one) and the request's path and query. Only
the standard library: copy it and replace `handle()` with what your service does."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOLERANCE = 300          # seconds a signature's timestamp may be off (replays older fail)


def verify(secret: str, header: str, body: bytes, url: str) -> bool:
    r"""X-Airflow-GPU-Signature: t=<unix time>,v2=<hex HMAC-SHA256 of "<t>\n<url>\n<body>">,
    `url` the one this request was sent to (this receiver's, never the request's Host)."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > TOLERANCE:
        return False
    signed = f"{timestamp}\n{url}\n".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields.get("v2", ""))


def handle(path: str, note: dict) -> None:
    """What to do with a notification (here: print it)."""
    job = note["job"]
    print(f"POST {path} {note['kind']} ({note['event']}) job {job['name']} of "
          f"{job['team']}, {job['state']}: {note['message']} [signature valid, delivery "
          f"{note['delivery_id']}]", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000, help="0: any free port")
    p.add_argument("--secret-file", required=True, type=Path)
    p.add_argument("--base-url", help="scheme://host:port the service POSTs to (default: "
                   "http://HOST:PORT)")
    args = p.parse_args()
    seen: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):                   # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            secret = args.secret_file.read_text().strip()
            url = base + self.path              # the URL as the service was given it
            if not verify(secret, self.headers.get("X-Airflow-GPU-Signature", ""), body,
                          url):
                self.send_response(401)      # not from the service: never retried
            else:
                delivery = self.headers.get("X-Airflow-GPU-Delivery", "")
                if delivery not in seen:     # a retry of one already handled: skip it
                    seen.add(delivery)
                    handle(self.path, json.loads(body))
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    base = (args.base_url or f"http://{args.host}:{server.server_port}").rstrip("/")
    print(f"listening on {base}/hook", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

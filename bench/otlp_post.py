"""CPU per OTLP/HTTP POST: ``OtlpPost`` against a plain ``requests.Session.post``, one run.

The span exporter POSTs a batch of 85 short requests' spans (~118 kB) at a time from its
thread. This sends the same body to a real OTLP receiver in another process, alternating
``OtlpPost`` (to a plain ``http://`` endpoint: ``http.client`` on a kept-alive connection,
``otlp_direct``) and ``requests.Session.post`` as ``OtlpPost`` called it before the seventh
round (``Session.request`` reads the proxies, ``REQUESTS_CA_BUNDLE`` and ~/.netrc from the
environment on every call), and prints the CPU of the sending thread per POST of each
(microseconds).

    .venv/bin/python -m bench.otlp_post --posts 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import requests

from bench.exporter_cost import finished, receiver_process
from obs.exporters.otlp_http import OtlpPost, OtlpSettings, default_resource
from obs.exporters.otlp_proto import export_request
from obs.exporters.otlp_spans import request_spans


def _per_post_us(send: Callable[[], None], posts: int) -> float:
    t0 = time.thread_time()
    for _ in range(posts):
        send()
    return (time.thread_time() - t0) / posts * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.otlp_post", description=__doc__)
    ap.add_argument("--posts", type=int, default=2000, help="POSTs per round and way")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    with receiver_process() as port:
        url = f"http://127.0.0.1:{port}/v1/traces"
        body = export_request(
            default_resource(), [request_spans(finished(i, 2)) for i in range(85)]
        )
        settings = OtlpSettings(url, headers={"content-type": "application/x-protobuf"})
        post = OtlpPost(settings, "bench", lambda: False)
        session = requests.Session()

        def plain() -> None:
            resp = session.post(
                url, data=body, headers=settings.headers, timeout=10.0, verify=True, cert=None
            )
            resp.raise_for_status()

        def lean() -> None:
            if post(body) is not None:
                raise RuntimeError("the receiver refused a POST")

        rows: dict[str, list[float]] = {"requests.Session.post": [], "OtlpPost": []}
        for _ in range(args.rounds):
            rows["requests.Session.post"].append(_per_post_us(plain, args.posts))
            rows["OtlpPost"].append(_per_post_us(lean, args.posts))
        post.close()
    print(f"CPU per POST of {len(body)} bytes (us), {args.rounds} rounds:")
    for name, values in rows.items():
        each = " ".join(f"{v:.0f}" for v in values)
        print(f"  {name:22s} median {statistics.median(values):5.0f}   rounds {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``fieldsales-demo-api``: serve the demo API until SIGINT/SIGTERM.

When ready it prints one line of JSON, ``{"base_url": ..., "token": ...}``, and flushes stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import signal
import sys
import threading

from fieldsales_dagster.demo_api.data import PROFILES, Shape
from fieldsales_dagster.demo_api.server import DemoConfig, DemoServer

#: The shape's knobs on the command line: option -> (Shape field, help).
SHAPE_OPTIONS = {
    "--events-per-pos": ("events_per_pos", "events per point of sale"),
    "--status-history": ("status_history", "at least this many status-history entries per event"),
    "--event-reports": ("event_reports", "custom reports on every event (0: on ~40%%, 1-2 each)"),
    "--report-fields": (
        "report_fields",
        "repeat each custom-report configuration's fields N times (N times the results per "
        "transaction and per event report)",
    ),
    "--pos-extra-fields": ("pos_extra_fields", "extra attributes in every point-of-sale object"),
    "--tx-per-event": ("tx_per_event", "transactions per event when --events is not given"),
    "--undated-events": ("undated_events", "percent of events with an empty status history"),
}


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fieldsales-demo-api",
        description="Serve a deterministic, synthetic demo of the Field-Sales read API.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--transactions", type=int, default=2000)
    p.add_argument(
        "--events", type=int, default=None, help="default: transactions // --tx-per-event"
    )
    p.add_argument("--event-groups", type=int, default=None, help="default: events // 10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="demo",
        help="how heavy the items are: demo (default), heavy (a real tenant's weight: event "
        "payloads ~4x the demo's, twice the custom-report results per transaction) or a shape "
        "that changes one knob of demo (demo_api.data.PROFILES); the options below override "
        "single knobs of it",
    )
    for option, (_, text) in SHAPE_OPTIONS.items():
        p.add_argument(option, type=int, default=None, help=text)
    p.add_argument(
        "--generation",
        type=int,
        default=0,
        help="serve the data as evolved to this generation (0: as generated; see Dataset.evolve)",
    )
    p.add_argument(
        "--changed-events",
        type=int,
        default=None,
        help="events that advance a state per generation (default: 1%%, at least 3); a tenth as "
        "many are deleted and as many added",
    )
    p.add_argument(
        "--numeric-event-ids",
        action="store_true",
        help="send events' _id as JSON numbers (1002), and transactions' eventId as a number or "
        "its digits in a string, alternately",
    )
    p.add_argument("--token", default=None, help="initial bearer token (default: random)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added before each response")
    p.add_argument("--limit-cap", type=int, default=None, help="serve at most N items per page")
    p.add_argument(
        "--prerender",
        action="store_true",
        help="render every item once at start and serve pages from memory (for benchmarks: "
        "serving then costs far less than loading; needs memory about the size of the data)",
    )
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a --host that is not loopback"
    )
    return p


def _shape(args: argparse.Namespace) -> Shape:
    """The profile's shape with the knobs given on the command line."""
    knobs = {
        name: getattr(args, option[2:].replace("-", "_"))
        for option, (name, _) in SHAPE_OPTIONS.items()
    }
    return dataclasses.replace(
        PROFILES[args.profile], **{k: v for k, v in knobs.items() if v is not None}
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not _is_loopback(args.host) and not args.allow_remote:
        print(
            f"refusing to serve on non-loopback host {args.host!r} without --allow-remote",
            file=sys.stderr,
        )
        return 2
    try:
        config = DemoConfig(
            transactions=args.transactions,
            events=args.events,
            event_groups=args.event_groups,
            seed=args.seed,
            shape=_shape(args),
            numeric_event_ids=args.numeric_event_ids,
            changed_events=args.changed_events,
        )
        server = DemoServer(config, host=args.host, port=args.port, token=args.token)
        server.behaviour.latency_s = max(0.0, args.latency_ms / 1000)
        server.behaviour.limit_cap = args.limit_cap
        server.behaviour.evolve(args.generation)
        if args.prerender:
            server.prerender()
        server.start()
    except (OSError, ValueError) as exc:
        print(f"fieldsales-demo-api: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    print(json.dumps({"base_url": server.base_url, "token": server.token}), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

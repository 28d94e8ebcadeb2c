"""`rankscope coordinator`, `capture`, `sweeps`, `nodes`, `cancel`, `report` and `fetch`."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from rankscope.analysis.report import fmt_ns, ranks_text
from rankscope.cli import parse_duration, parse_labels, parse_path
from rankscope.checksum import sha256_of
from rankscope.coordinator.client import SweepClient, node_progress, node_state_name, state_name
from rankscope.coordinator.config import resolve
from rankscope.coordinator.registry import labels_text
from rankscope import node_name, output, signals, tls
from rankscope.errors import CallTimedOut, InputError, RankscopeError, TransportError, shown
from rankscope.lock import NO_LOCKS
from rankscope.memory import keep_chunk_memory
from rankscope.progress import Progress
from rankscope.records import scalars
from rankscope.proto.v1 import rankscope_pb2 as pb

# Exit codes of `capture --wait`: the report is printed in every case but a failed sweep.
EXIT_PARTIAL = 3
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # the shell's code for SIGINT, as the CLI gives it elsewhere
EXIT_FINDINGS = 4  # with --fail-on-findings: a straggler or a slow link (a scheduled health sweep's alarm)
# With --fail-on-findings: the report could not judge stragglers (a one-step window, too few
# ranks). Not a clean bill: passing would hide a sweep that checked nothing.
EXIT_NOT_JUDGED = 5
# `fetch --kind`: the artifact kinds by the names users give them.
_KINDS = {"raw": pb.ARTIFACT_KIND_RAW, "digest": pb.ARTIFACT_KIND_DIGEST}


MAX_COUNT = 2**31 - 1  # the wire's int32


def parse_count(text: str) -> int:
    """A whole number from 0 to `MAX_COUNT` (beyond, protobuf raised a ValueError)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0 to {MAX_COUNT}")
    return value


def parse_nodes(text: str) -> list[str]:
    """--nodes A,B: at least one name, each one an agent can have (a typo like 'a b' is
    told here as no name, not by the coordinator as no such agent)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no node")
    for name in names:
        if (wrong := node_name.problem(name)) is not None:
            raise argparse.ArgumentTypeError(f"{name!r}: {wrong}")
    return names


def parse_selector(text: str) -> dict[str, str]:
    """--labels K=V,... of a sweep: at least one, where none would be taken as no choice."""
    labels = parse_labels(text)
    if not labels:
        raise argparse.ArgumentTypeError(f"{text!r} names no label (K=V)")
    return labels


def parse_reason(text: str) -> str:
    """A cancel's reason, not blank: the nodes it stopped are found by their reason, and in
    place of a blank one the coordinator puts its own (none was found)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a reason, or leave --reason out")
    return text


def parse_option(text: str) -> tuple[str, str]:
    """One backend option, K=V; the value may hold commas (a list of ranks, say)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key.strip(), value.strip()


def register(subparsers: argparse._SubParsersAction) -> None:
    for add in (_add_coordinator_command, _add_capture, _add_sweeps, _add_nodes, _add_cancel, _add_report, _add_fetch):
        add(subparsers)


def _add_coordinator_option(parser: argparse.ArgumentParser) -> None:
    """--coordinator (required unless $RANKSCOPE_COORDINATOR names it) and the TLS client options."""
    default = os.environ.get("RANKSCOPE_COORDINATOR")
    parser.add_argument("--coordinator", metavar="HOST:PORT", default=default, required=default is None,
                        help="the coordinator's address (default: $RANKSCOPE_COORDINATOR)")
    tls.add_client_arguments(parser)


def _add_sweep_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="SWEEP", help="the sweep's id (`rankscope sweeps` lists them)")


def _add_report_options(parser: argparse.ArgumentParser, *, after_wait: bool) -> None:
    """--format and --plot, which `capture` takes only with --wait."""
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help=f"report format{' with --wait' if after_wait else ''} (default: table)")
    parser.add_argument("--plot", type=parse_path, metavar="FILE",
                        help=f"{'with --wait, ' if after_wait else ''}also draw the per-rank picture (PNG/SVG/PDF; "
                             "needs matplotlib)")


def _add_coordinator_command(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "coordinator", help="run the coordinator (gRPC control plane and ingest)",
        description="Run the coordinator: agents dial in to it, sweeps are started through it, and it stores "
                    "their uploads and analyses them (SQLite state and artifacts in --data-dir).")
    serve.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default 0.0.0.0:7443; port 0 picks one)")
    serve.add_argument("--data-dir", type=parse_path, metavar="DIR", help="state and artifacts (default ./rankscope-data)")
    serve.add_argument("--max-upload-bytes", metavar="SIZE",
                       help="refuse larger uploads: bytes, or with K, M, G or T (1024s), e.g. 8G (default 8G)")
    serve.add_argument("--node-timeout", type=parse_duration, metavar="DURATION",
                       help="time beyond the capture window before a silent node is given up (default 120s)")
    serve.add_argument("--port-file", type=parse_path, metavar="FILE", help="write the bound port here once serving")
    serve.add_argument("--tls-cert", type=parse_path, metavar="PEM", help="serve TLS with this certificate (and --tls-key)")
    serve.add_argument("--tls-key", type=parse_path, metavar="PEM", help="the certificate's private key")
    serve.add_argument("--tls-client-ca", type=parse_path, metavar="PEM",
                       help="require client certificates signed by this CA (mTLS)")
    serve.add_argument("--node-certs", action="store_true", default=None,
                       help="each agent holds its own node's certificate: it registers only under a name the "
                            "certificate carries (its CN or a subject alternative name); needs --tls-client-ca")
    serve.set_defaults(func=run_coordinator)


def _add_capture(subparsers: argparse._SubParsersAction) -> None:
    capture = subparsers.add_parser(
        "capture", help="start a fleet-wide capture (a sweep)",
        description="Start a capture on the chosen nodes at once (a sweep) and print its id; with --wait, follow "
                    "it and print its report.")
    _add_coordinator_option(capture)
    targets = capture.add_mutually_exclusive_group(required=True)
    targets.add_argument("--nodes", type=parse_nodes, metavar="A,B",
                         help="these nodes, by agent name")
    targets.add_argument("--labels", type=parse_selector, metavar="K=V,...", help="the agents with all these labels (one not connected is "
                         "named in the report as missing, not captured)")
    targets.add_argument("--all", action="store_true", help="every agent (as --labels)")
    capture.add_argument("--duration", type=parse_duration, default=20.0, metavar="DURATION",
                         help="capture window (default 20s, at most 1h)")
    capture.add_argument("--backend", default="", help="capture backend: nsys, torch or sim (default: the nodes' "
                         "own, the first each agent offers, where they agree)")
    capture.add_argument("--timeout", type=parse_duration, default=0.0, metavar="DURATION",
                         help="give up on nodes not finished this long after the start (default: duration + the "
                              "coordinator's node timeout)")
    capture.add_argument("--option", type=parse_option, action="append", default=[], metavar="K=V",
                         help="backend option (repeatable)")
    capture.add_argument("--upload-raw", action="store_true", help="also upload the profilers' own files (nsys reports and their SQLite exports, "
                         "Kineto traces): rankscope fetch gets them")
    capture.add_argument("--wait", action="store_true",
                         help="show progress and print the report; exit 0 analysed, 3 partial, 1 failed "
                              f"(with --fail-on-findings {EXIT_FINDINGS}: findings, {EXIT_NOT_JUDGED}: stragglers not "
                              f"judged; {EXIT_INTERRUPTED}: stopped waiting with Ctrl-C, the sweep goes on)")
    _add_report_options(capture, after_wait=True)
    capture.add_argument("--fail-on-findings", action="store_true",
                         help=f"with --wait, exit {EXIT_FINDINGS} when the report flags a straggler or a slow link, "
                              f"{EXIT_NOT_JUDGED} when it could not judge stragglers (it says why), else 0, a partial "
                              "report too (its warnings name the nodes missing); for scheduled health sweeps: the "
                              "job fails, and alerting sees it")
    capture.set_defaults(func=run_capture)


def _add_sweeps(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser(
        "sweeps", help="list sweeps, newest first",
        description="List sweeps, newest first, with each one's stragglers and slow links, then the nodes and "
                    "links flagged in more than one of them.")
    _add_coordinator_option(listing)
    listing.add_argument("--limit", type=parse_count, default=20, help="at most this many (0: all; default: 20)")
    listing.set_defaults(func=run_sweeps)


def _add_nodes(subparsers: argparse._SubParsersAction) -> None:
    nodes = subparsers.add_parser(
        "nodes", help="list the nodes whose agents the coordinator knows",
        description="List the nodes whose agents the coordinator knows, by name: connected or when last seen, "
                    "labels, GPUs, the ranks announced on the node (as of its agent's last heartbeat), capture "
                    "backends and the options each reads (capture --option), clock offset, and the sweep capturing "
                    "there. A sweep by --labels or --all takes these, less those away for over a day.")
    _add_coordinator_option(nodes)
    nodes.add_argument("--labels", type=parse_selector, default={}, metavar="K=V,...",
                       help="only the nodes with all these labels")
    nodes.add_argument("--format", choices=("table", "json"), default="table", help="(default: table)")
    nodes.set_defaults(func=run_nodes)


def _add_cancel(subparsers: argparse._SubParsersAction) -> None:
    cancel = subparsers.add_parser("cancel", help="stop a running sweep: its nodes end their captures, "
                                                  "what finished is analysed",
                                   description="Stop a running sweep: its nodes end their captures, and what "
                                               "finished is analysed.")
    _add_coordinator_option(cancel)
    _add_sweep_argument(cancel)
    cancel.add_argument("--reason", type=parse_reason, default="cancelled by the user", help="shown as each stopped node's reason (default: %(default)s)")
    cancel.set_defaults(func=run_cancel)


def _add_report(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="print a sweep's report",
                                   description="Print a sweep's report; exit 1 where the sweep failed and has none.")
    _add_coordinator_option(report)
    _add_sweep_argument(report)
    _add_report_options(report, after_wait=False)
    report.set_defaults(func=run_report)


def _add_fetch(subparsers: argparse._SubParsersAction) -> None:
    fetch = subparsers.add_parser(
        "fetch", help="download a sweep's raw exports and digests from the coordinator",
        description="Download what a sweep's agents uploaded to the coordinator (the profilers' own files, where the "
                    "capture ran with --upload-raw: nsys reports and their SQLite exports, Kineto traces; and digests) "
                    "into DIR/<node>/<name>. Each file is written whole "
                    "or not at all, its sha256 checked against the coordinator's record; a file already there with "
                    "that sha256 is kept, and one with other bytes is not replaced: fetch then names it and fetches nothing.")
    _add_coordinator_option(fetch)
    _add_sweep_argument(fetch)
    fetch.add_argument("-o", "--output", type=parse_path, metavar="DIR", help="where to write (default: ./SWEEP)")
    fetch.add_argument("--kind", choices=tuple(_KINDS), help="only raw exports or only digests (default: both)")
    fetch.set_defaults(func=run_fetch)


def _client(args: argparse.Namespace) -> SweepClient:
    return SweepClient(args.coordinator, tls.client_files(args))


# coordinator ---------------------------------------------------------------------------


def run_coordinator(args: argparse.Namespace) -> int:
    from rankscope.coordinator.server import create_server

    config = resolve({"listen": args.listen, "data_dir": args.data_dir, "max_upload_bytes": args.max_upload_bytes,
                      "node_timeout_s": args.node_timeout, "tls_cert": args.tls_cert, "tls_key": args.tls_key,
                      "tls_client_ca": args.tls_client_ca, "node_certs": args.node_certs})
    if args.port_file:
        output.check_writable(args.port_file)  # before serving: a server must not start only to fail
    server, port = create_server(config=config)
    stop = threading.Event()
    signals.on_stop(lambda *_: stop.set())
    server.start()
    host = config.listen.rsplit(":", 1)[0]
    if args.port_file:
        output.write_text(args.port_file, f"{port}\n")
    security = ("mTLS, node certificates" if config.node_certs else "mTLS" if config.tls_client_ca else
                "TLS" if config.tls_cert else "plaintext")
    print(f"rankscope coordinator listening on {host}:{port} ({security}; data in {shown(config.data_dir)})",
          file=sys.stderr, flush=True)
    stop.wait()
    print("rankscope coordinator stopping", file=sys.stderr, flush=True)
    server.stop()
    return 0


# capture / sweeps / report -------------------------------------------------------------

# Above this many nodes, `capture --wait` shows counts per state (and each failed node),
# not a line per change: a fleet's six changes per node would be thousands of lines.
FLEET_NODES = 16
_FAILED_NODE = frozenset({pb.NODE_STATE_FAILED, pb.NODE_STATE_TIMED_OUT})


def run_capture(args: argparse.Namespace) -> int:
    if args.fail_on_findings and not args.wait:
        raise InputError("--fail-on-findings judges the report, which only --wait waits for")
    if args.format != "table" and not args.wait:
        raise InputError(f"--format {args.format} formats the report, which only --wait waits for "
                         "(`rankscope report --format` prints it later)")
    if args.plot is not None:
        if not args.wait:
            raise InputError("--plot draws the report, which only --wait waits for")
        _check_plot(args.plot)
    if twice := [key for key, n in Counter(key for key, _ in args.option).items() if n > 1]:
        raise InputError(f"--option {', '.join(twice)} given twice")  # else the last would win unseen
    options = dict(args.option)
    with _client(args) as client:
        sweep: pb.Sweep | None = None  # set once the coordinator has answered: a sweep runs
        try:
            sweep = client.start(nodes=args.nodes or (), labels=args.labels, everything=args.all,
                                 duration_s=args.duration, backend=args.backend, timeout_s=args.timeout,
                                 options=options, upload_raw=args.upload_raw)
            _say_started(sweep)
            if not args.wait:
                print(sweep.sweep_id)
                return 0
            final = _follow(client, sweep.sweep_id)
        except CallTimedOut as exc:
            if sweep is not None:
                raise
            raise CallTimedOut(f"{exc}: {_may_have_started(args)}") from None
        except TransportError as exc:  # the coordinator stayed away: the sweep may still end there
            if sweep is None:
                raise
            raise TransportError(f"{exc}; stopped waiting for sweep {sweep.sweep_id}, which may still finish once "
                                 f"the coordinator is back ({_command_line(args, 'report', sweep.sweep_id)} "
                                 "prints its report)") from None
        except (KeyboardInterrupt, RuntimeError) as exc:
            if not signals.interrupted(exc):
                raise
            # Only the command stops: the nodes capture on (DCGM paused), and the coordinator analyses.
            print(_interrupted(args, sweep), file=sys.stderr)
            return EXIT_INTERRUPTED
        if final.state == pb.SWEEP_STATE_FAILED:
            print(f"rankscope: sweep {final.sweep_id} failed: {final.error}", file=sys.stderr)
            return EXIT_FAILED
        _print_report(client.report(final.sweep_id), args)
        if args.fail_on_findings:  # the health sweep's question: did the report flag anything?
            return _health(final)
        return EXIT_PARTIAL if final.state == pb.SWEEP_STATE_PARTIAL else 0


def _interrupted(args: argparse.Namespace, sweep: pb.Sweep | None) -> str:
    """What a Ctrl-C during `capture` leaves running, and how to stop it: the sweep named, or,
    where StartSweep had not answered, one that may have started all the same."""
    if sweep is None:
        return f"rankscope: interrupted before the coordinator answered; {_may_have_started(args)}"
    cancel = f"{_command_line(args, 'cancel', sweep.sweep_id)} stops it"
    if not args.wait:
        return f"rankscope: interrupted; sweep {sweep.sweep_id} goes on ({cancel})"
    return (f"rankscope: stopped waiting; sweep {sweep.sweep_id} goes on "
            f"({_command_line(args, 'report', sweep.sweep_id)} prints its report, {cancel})")


def _may_have_started(args: argparse.Namespace) -> str:
    """Said where StartSweep went out unanswered: its sweep may run, holding DCGM paused."""
    return (f"a sweep may have started all the same ({_command_line(args, 'sweeps')} lists the sweeps, "
            f"{_command_line(args, 'cancel')} SWEEP stops one)")


def _health(sweep: pb.Sweep) -> int:
    """A health sweep's exit code: findings first (a slow link is one even where stragglers
    were not judged), then whether the report could judge at all."""
    if sweep.stragglers or sweep.slow_links:
        return EXIT_FINDINGS
    return EXIT_NOT_JUDGED if sweep.stragglers_not_judged else 0


def _command_line(args: argparse.Namespace, command: str, *words: str) -> str:
    """The `rankscope COMMAND ... WORDS` line that reaches this sweep's coordinator as this command
    did: a hint without --coordinator only failed, asking for it, where no $RANKSCOPE_COORDINATOR is set."""
    line = ["rankscope", command, "--coordinator", args.coordinator]
    for flag in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(args, flag, None) is not None:
            line += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return shlex.join([*line, *words])


def _say_started(sweep: pb.Sweep) -> None:
    names = [n.node for n in sweep.nodes]
    listed = ", ".join(names if len(names) <= FLEET_NODES else [*names[:3], "...", names[-1]])
    print(f"sweep {sweep.sweep_id} started on {len(names)} node(s): {listed}", file=sys.stderr, flush=True)


def _follow(client: SweepClient, sweep_id: str) -> pb.Sweep:
    """Progress on stderr, a line per node change; for a fleet (over `FLEET_NODES`), a
    line per failed node and the count of nodes in each state, at most once a second
    (and when all nodes share a state, and at the end). The final sweep is returned."""
    seen: dict[str, tuple[int, str]] = {}
    started = time.monotonic()
    counted, counted_at = "", 0.0
    sweep = fleet = None

    def lost(error: RankscopeError, reconnect_s: float) -> None:  # else the log goes quiet for minutes
        _say(started, f"{error}; watching again for up to {reconnect_s:g}s")

    for event in client.watch(sweep_id, on_lost=lost):
        sweep = event.sweep
        fleet = len(sweep.nodes) > FLEET_NODES if fleet is None else fleet  # the first event has every node
        for node in sweep.nodes:
            key = (node.state, node.detail)
            if seen.get(node.node) != key:
                seen[node.node] = key
                if not fleet or node.state in _FAILED_NODE:
                    _say(started, _node_line(node))
        if fleet:
            counts = Counter(state for state, _ in seen.values())
            line = f"{len(seen)} nodes: " + ", ".join(f"{n} {node_state_name(s)}" for s, n in sorted(counts.items()))
            if line != counted and (time.monotonic() - counted_at >= 1.0 or len(counts) == 1 or event.final):
                _say(started, line)
                counted, counted_at = line, time.monotonic()
    if sweep is None:
        raise TransportError(f"coordinator at {client.address} sent nothing about sweep {sweep_id}")
    return sweep


def _node_line(node: pb.NodeProgress) -> str:
    state, says = node_progress(node)
    return f"{node.node:<20} {state:<13} {says}"


def _say(started: float, text: str) -> None:
    print(f"  {time.monotonic() - started:6.1f}s  {text}".rstrip(), file=sys.stderr, flush=True)


def _check_plot(path: Path) -> None:
    from rankscope.analysis import plot

    plot.check(path)  # fail before starting a sweep


def _print_report(reply: pb.ReportReply, args: argparse.Namespace) -> None:
    """The report in ``args.format`` on stdout (and ``args.plot`` drawn), where it is on stderr."""
    fmt, plot_path = args.format, args.plot
    if not reply.report_json:
        raise InputError(f"sweep {reply.sweep_id} has no report yet (state {state_name(reply.state)})")
    if fmt == "json":
        print(reply.report_json)
    if fmt == "table" or plot_path is not None:
        from rankscope.analysis.report import Report

        try:
            report = Report.from_dict(json.loads(reply.report_json))
        except (ValueError, KeyError, TypeError) as exc:  # e.g. a coordinator of another version
            raise InputError(f"the report of sweep {reply.sweep_id} cannot be read here "
                             f"({type(exc).__name__}: {exc}); --format json prints it as it came") from None
        if fmt == "table":
            print(report.render_table())
        if plot_path is not None:
            from rankscope.analysis import plot

            plot.save(report, plot_path)
    if reply.missing:
        # A node a user's cancel stopped is no node down: said apart (an older coordinator
        # sends no `cancelled`: its cancelled nodes stay under missing).
        missing = [n for n in reply.missing if n not in reply.cancelled]
        parts = [f"{what} nodes: {', '.join(nodes)}" for what, nodes in (("cancelled", reply.cancelled), ("missing", missing))
                 if nodes]
        print(f"rankscope: sweep {reply.sweep_id} is partial; {'; '.join(parts)}", file=sys.stderr)
    # The coordinator's path, which on another host (a pod) is no file here.
    print(f"report on the coordinator's host: {shown(reply.path)}", file=sys.stderr)
    if reply.raw_exports:
        print(f"raw exports: {reply.raw_exports} on the coordinator; "
              f"{_command_line(args, 'fetch', '--kind', 'raw', reply.sweep_id)} downloads them into ./{reply.sweep_id}",
              file=sys.stderr)


def run_sweeps(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sweeps = client.sweeps(args.limit)
    if not sweeps:
        print("no sweeps", file=sys.stderr)
        return 0
    rows = [["SWEEP", "STATE", "NODES", "BACKEND", "STARTED (UTC)", "STRAGGLERS (RANK@NODE)",
             "SLOW LINKS (RANKS: SHARE OF LIKE ONES' BUSBW)", "MISSING"]]
    for sweep in sweeps:
        counted, missing = _outcomes(sweep)
        started = _utc(sweep.created_ns)
        flagged = ",".join(f"{s.rank}@{s.node}" for s in sweep.stragglers) or _no_straggler(sweep)
        links = " ".join(f"{ranks_text(list(link.ranks))}:{link.busbw_gbps / link.peers_busbw_gbps:.0%}"
                         for link in sweep.slow_links) or "none" if sweep.report_path else "-"
        rows.append([sweep.sweep_id, state_name(sweep.state), counted, sweep.backend, started, flagged, links, missing])
    _print_rows(rows)
    repeated = repeat_findings(sweeps)
    if repeated:
        print(f"\nflagged again and again: {repeated}")
    return 0


def _print_rows(rows: list[list[str]]) -> None:
    """A header and its rows, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _utc(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9))


def run_nodes(args: argparse.Namespace) -> int:
    with _client(args) as client:
        nodes = client.nodes(args.labels)
    if args.format == "json":
        print(json.dumps({"schema": "rankscope.nodes/1", "nodes": [_node_record(n) for n in nodes]}, indent=2))
        return 0
    if not nodes:
        print(f"no node has labels {labels_text(args.labels)}" if args.labels else "no agent has registered",
              file=sys.stderr)
        return 0
    rows = [["NODE", "HOST", "STATE", "LAST SEEN (UTC)", "LABELS", "GPUS", "RANKS", "BACKENDS", "OPTIONS",
             "CLOCK (±)", "VERSION", "SWEEP"]]
    for n in nodes:
        labels = labels_text(n.labels) or "-"
        ranks = ranks_text(sorted(r.rank for r in n.ranks)) if n.ranks else "-"
        clock = f"{fmt_ns(n.clock_offset_ns)} ({fmt_ns(n.clock_rtt_ns / 2)})" if n.clock_known else "-"
        # A connected agent's record is saved now and then (`SEEN_SAVE_NS`): its last save is no news.
        rows.append([n.node, n.hostname or "-", "connected" if n.connected else "away",
                     "now" if n.connected else _utc(n.last_seen_ns), labels,
                     str(len(n.gpus)), ranks, ",".join(n.backends) or "-", _options_text(n.backend_options), clock,
                     n.versions.rankscope or "-", n.sweep_id or "-"])
    _print_rows(rows)
    return 0


def _options_text(said: Iterable[pb.BackendOptions]) -> str:
    """The OPTIONS cell: backend:option,... for each backend its agent said, "-" for one
    that reads none; "-" alone where the agent said nothing (it predates saying so)."""
    return ";".join(f"{s.backend}:{','.join(s.options) or '-'}" for s in said) or "-"


def _node_record(node: pb.NodeInfo) -> dict:
    """One node of `nodes --format json`: the wire's fields, the clock's as null where no ping measured it."""
    return {
        "node": node.node, "hostname": node.hostname, "labels": dict(node.labels), "connected": node.connected,
        "last_seen_ns": node.last_seen_ns, "registered_ns": node.registered_ns,
        "gpus": [scalars(g) for g in node.gpus], "ranks": [scalars(r) for r in node.ranks],
        "backends": list(node.backends),
        "capture_options": {said.backend: list(said.options) for said in node.backend_options},
        "rankscope_version": node.versions.rankscope,
        "clock_offset_ns": node.clock_offset_ns if node.clock_known else None,
        "clock_rtt_ns": node.clock_rtt_ns if node.clock_known else None,
        "sweep_id": node.sweep_id or None,
    }


def _outcomes(sweep: pb.Sweep) -> tuple[str, str]:
    """A sweep's NODES and MISSING cells: its nodes analysed of all (and how many a cancel
    stopped, where any), and the nodes without data otherwise. A cancelled node has no data
    either, but a user stopped it: under MISSING it read as a node down."""
    cancelled = {n.node for n in sweep.nodes if n.state == pb.NODE_STATE_CANCELLED}
    done = sum(n.state == pb.NODE_STATE_ANALYSED for n in sweep.nodes)
    counted = f"{done}/{len(sweep.nodes)}" + (f" ({len(cancelled)} cancelled)" if cancelled else "")
    return counted, ",".join(n for n in sweep.missing if n not in cancelled) or "-"


def _no_straggler(sweep: pb.Sweep) -> str:
    """What a sweep naming no straggler shows: "none" where its report judged and nothing
    stands out, "not judged" where the report could not tell (`rankscope report` says why),
    "-" where there is no report (yet)."""
    if not sweep.report_path:
        return "-"
    return "not judged" if sweep.stragglers_not_judged else "none"


def repeat_findings(sweeps: list[pb.Sweep]) -> str:
    """The nodes with stragglers and the slow links found in more than one analysed sweep
    listed, most often first: what scheduled health sweeps are for."""
    analysed = [s for s in sweeps if s.report_path]
    nodes: dict[str, set[str]] = {}
    links: dict[tuple[int, ...], set[str]] = {}
    for sweep in analysed:
        for straggler in sweep.stragglers:
            nodes.setdefault(straggler.node, set()).add(sweep.sweep_id)
        for link in sweep.slow_links:
            links.setdefault(tuple(link.ranks), set()).add(sweep.sweep_id)
    found = [(len(ids), f"node {node}") for node, ids in nodes.items() if len(ids) > 1]
    found += [(len(ids), f"link of ranks {ranks_text(list(ranks))}") for ranks, ids in links.items() if len(ids) > 1]
    return ", ".join(f"{what} in {count} of {len(analysed)} sweeps" for count, what in sorted(found, key=lambda f: -f[0]))


def run_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sweep = client.cancel(args.sweep, args.reason)
    stopped = [n.node for n in sweep.nodes if n.state == pb.NODE_STATE_CANCELLED]
    cut = [n.node for n in sweep.nodes if n.digest_only]
    print(f"sweep {sweep.sweep_id}: stopped {len(stopped)} node(s) ({', '.join(stopped) or 'none'}); "
          + (f"{len(cut)} node(s) uploading raw exports end on their stored digests ({', '.join(cut)}); " if cut else "")
          + (f"the nodes that finished are being analysed ({_command_line(args, 'report', sweep.sweep_id)})"
             if sweep.state == pb.SWEEP_STATE_ANALYSING else f"now {state_name(sweep.state)}: {sweep.error}"),
          file=sys.stderr)
    return 0


def run_report(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot(args.plot)
    with _client(args) as client:
        reply = client.report(args.sweep)
        if reply.state == pb.SWEEP_STATE_FAILED:  # it never will have a report: say why, as capture --wait does
            print(f"rankscope: sweep {reply.sweep_id} failed: {reply.error}", file=sys.stderr)
            return EXIT_FAILED
        _print_report(reply, args)
    return 0


# fetch -----------------------------------------------------------------------------------

PROGRESS_FROM_BYTES = 16 << 20  # smaller downloads take no time worth watching


class CorruptDownload(RankscopeError):
    """An artifact arrived, but not as the coordinator recorded it (size or sha256)."""


def run_fetch(args: argparse.Namespace) -> int:
    keep_chunk_memory()  # each 1 MiB chunk reuses freed pages, as the coordinator's do
    with _client(args) as client:
        listing = client.artifacts(args.sweep, [_KINDS[args.kind]] if args.kind else [])
        _check_found(listing, args.kind)
        folder = output.make_folder(args.output or Path(args.sweep))
        todo = [(stored, _destination(folder, stored)) for stored in listing.artifacts]
        todo = [(stored, path) for stored, path in todo if not _already_there(path, stored.artifact)]
        _check_free(listing.sweep_id, [path for _, path in todo])
        total = sum(stored.artifact.size for stored, _ in todo)
        with Progress(f"fetching sweep {listing.sweep_id}", total, show=total >= PROGRESS_FROM_BYTES,
                      redraw_s=0.1, text=_mib) as progress:
            resumed = sum(_fetch_one(client, listing.sweep_id, stored, path, progress) for stored, path in todo)
    kept = len(listing.artifacts) - len(todo)
    print(f"fetched {len(todo)} file(s) ({total / (1 << 20):.1f} MiB) of sweep {listing.sweep_id} into {shown(folder)}"
          + (f"; {kept} already there" if kept else "")
          + (f"; {resumed} bytes resumed from an interrupted fetch" if resumed else ""))
    if not args.kind and not any(s.artifact.kind == pb.ARTIFACT_KIND_RAW for s in listing.artifacts):
        print(f"rankscope: sweep {listing.sweep_id} has no raw exports: {_why_no_raw(listing)}; "
              "fetched its digests", file=sys.stderr)
    if listing.state == pb.SWEEP_STATE_RUNNING:
        print(f"rankscope: sweep {listing.sweep_id} is not finished yet: these are the files its nodes had "
              "uploaded; run fetch again once it ends for the rest", file=sys.stderr)
    return 0


def _mib(done: int, total: int) -> str:
    return f"{done / (1 << 20):.1f} of {total / (1 << 20):.1f} MiB"


def _check_found(listing: pb.ListArtifactsReply, kind: str | None) -> None:
    """Nothing to fetch is an error that says why."""
    if listing.artifacts:
        return
    if kind == "raw":
        raise InputError(f"sweep {listing.sweep_id} has no raw exports: {_why_no_raw(listing)}")
    what = "digests" if kind == "digest" else "artifacts"
    if listing.state == pb.SWEEP_STATE_RUNNING:
        raise InputError(f"sweep {listing.sweep_id} is not finished yet: none of its nodes has uploaded {what} so far; "
                         "run fetch again once it ends")
    raise InputError(f"sweep {listing.sweep_id} has no {what} stored: none of its nodes has uploaded one")


def _why_no_raw(listing: pb.ListArtifactsReply) -> str:
    if not listing.upload_raw:
        return "it was captured without --upload-raw"
    if listing.state == pb.SWEEP_STATE_RUNNING:
        return "it is not finished yet, and none has been uploaded so far"
    return "none has been uploaded (the report's warnings name any that could not be)"


def _destination(folder: Path, stored: pb.StoredArtifact) -> Path:
    """DIR/<node>/<name>; names that would lead out of DIR are refused, not followed."""
    for part in (stored.node, stored.artifact.name):
        if part in ("", ".", "..") or Path(part).name != part:
            raise RankscopeError(f"the coordinator names an artifact {stored.node}/{stored.artifact.name}, "
                                 "which is no plain node and file name: nothing written for it")
    return folder / stored.node / stored.artifact.name


def _already_there(path: Path, artifact: pb.ArtifactRef) -> bool:
    """``path`` holds the artifact's bytes already (its size first: a mismatch costs no hashing);
    then a broken download's bytes of it left beside it are of no more use."""
    there = path.is_file() and path.stat().st_size == artifact.size and sha256_of(path) == artifact.sha256
    if there:
        _partial(path).unlink(missing_ok=True)
    return there


def _check_free(sweep_id: str, paths: list[Path]) -> None:
    """Refuse, before any download, to replace files that hold other bytes (another sweep's,
    fetched into the same folder; a user's own): fetch only adds the sweep's files."""
    taken = [path for path in paths if os.path.lexists(path)]
    if taken:
        raise InputError(f"{len(taken)} file(s) there hold other bytes than sweep {sweep_id}'s (another sweep's?), "
                         "and fetch replaces none: fetch into another folder (-o DIR) or remove them", path=taken[0])


def _partial(path: Path) -> Path:
    """Where a broken download of ``path`` keeps its bytes: hidden, and with no input's
    suffix, so `analyze DIR` passes it by."""
    return path.with_name(f".{path.name}.part")


def _fetch_one(client: SweepClient, sweep_id: str, stored: pb.StoredArtifact, path: Path, progress: Progress) -> int:
    """One artifact to ``path``, written whole or not at all: bytes that are not the ones the
    coordinator recorded leave no file (and an older one at ``path`` as it was). A broken
    download's bytes stay in ``.NAME.part`` beside it, and the next one asks for the rest
    only; returns how many bytes it took from there."""
    artifact = stored.artifact
    output.make_folder(path.parent)
    part = _partial(path)
    with output.writing(path):
        with open(part, "a+b") as handle:  # appends, whatever was read
            _hold(handle, path)
            handle.seek(0)
            hasher = hashlib.file_digest(handle, "sha256")
            resumed = size = handle.tell()
            offset = min(resumed, artifact.size)  # one too long is refused below, by its size
            progress.add(offset)
            try:
                for data in client.fetch(sweep_id, stored.node, artifact, offset):
                    handle.write(data)
                    hasher.update(data)
                    size += len(data)
                    progress.add(len(data))
            except BaseException as exc:  # a Ctrl-C too
                if not size:
                    part.unlink()  # nothing to resume from: no empty file left behind
                elif isinstance(exc, TransportError):
                    raise TransportError(f"{exc}; the {size} bytes of {stored.node}/{artifact.name} received are "
                                         "kept: run fetch again to resume") from None
                raise
            # Still held: no other fetch appends between the check and the rename.
            if (size, hasher.hexdigest()) != (artifact.size, artifact.sha256):
                part.unlink()  # the next fetch starts from zero
                raise CorruptDownload(_mismatch(artifact, size, hasher.hexdigest(), resumed), path=path)
            os.replace(part, path)
    return resumed


def _hold(handle: BinaryIO, path: Path) -> None:
    """Hold the partial for this fetch alone: two appending to it would each fail the check.
    The kernel lets go when the file closes, or the process ends."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise InputError("another fetch is downloading this file now; let it finish", path=path) from None
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            raise


def _mismatch(artifact: pb.ArtifactRef, size: int, sha256: str, resumed: int) -> str:
    if resumed:
        got, why = (f"the {size} bytes ({resumed} of them from an interrupted fetch)",
                    "those kept bytes are removed: run fetch again to download it whole")
    else:
        got, why = f"the {size} bytes received", "its stored copy may be damaged"
    return (f"{got} have sha256 {sha256}, the coordinator recorded {artifact.sha256} ({artifact.size} bytes): "
            f"not written ({why})")

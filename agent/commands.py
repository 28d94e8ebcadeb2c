"""`rankscope agent`: the per-node agent as a command."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket

from rankscope.agent import dcgm
from rankscope.agent.agent import BACKENDS, Agent, AgentConfig
from rankscope.agent.spool import DEFAULT_SPOOL
from rankscope import node_name, output, signals, tls
from rankscope.address import dial_problem
from rankscope.cli import parse_labels, parse_path
from rankscope.errors import ConfigError, RankscopeError

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "agent", help="run the node agent: capture on the coordinator's command, digest, upload",
        description="Run the node agent. It dials out to the coordinator, keeps a session open "
                    "(reconnecting with backoff), and runs each capture the coordinator starts.",
    )
    parser.add_argument("--coordinator", required=True, metavar="HOST:PORT", help="coordinator address")
    parser.add_argument("--name", default=None, help="node name in the fleet (default: the hostname)")
    parser.add_argument("--labels", type=parse_labels, default={}, metavar="K=V,...", help="labels sweeps can target")
    parser.add_argument("--spool", type=parse_path, default=DEFAULT_SPOOL,
                        help=f"folder where rank wrappers announce themselves (default: {DEFAULT_SPOOL})")
    parser.add_argument("--work-dir", type=parse_path, default=None,
                        help="where captures in flight are kept (default: SPOOL/agent-NAME)")
    parser.add_argument("--backend", default="nsys", metavar="NAME[,NAME...]",
                        help=f"capture backends this node offers ({', '.join(BACKENDS)}), the first its default "
                             "(default: %(default)s)")
    parser.add_argument("--upload-limit", type=float, default=None, metavar="MB/S",
                        help="cap upload bandwidth so the training job keeps its network (default: none)")
    parser.add_argument("--max-backoff", type=float, default=30.0, metavar="SECONDS",
                        help="longest wait between reconnect attempts (default: 30), at most half the time the "
                             "coordinator says it waits for an agent away before judging it lost")
    tls.add_client_arguments(parser)
    dcgm.add_arguments(parser)
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    name = socket.gethostname() if args.name is None else args.name  # `--name ""` (an unset variable) is no name
    if (wrong := node_name.problem(name)) is not None:
        raise ConfigError(f"--name {name!r}: {wrong}" if args.name is not None
                          else f"host name {name!r}: {wrong}; choose one with --name")
    backends = tuple(filter(None, (b.strip() for b in args.backend.split(","))))
    if not backends:
        raise ConfigError("--backend names no capture backend")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ConfigError(f"--backend: unknown capture backend {unknown[0]!r} (known: {', '.join(BACKENDS)})")
    if args.upload_limit is not None and not args.upload_limit > 0:  # nan too: it paced nothing
        raise ConfigError(f"--upload-limit must be positive, got {args.upload_limit}")
    if not args.max_backoff > 0:
        raise ConfigError(f"--max-backoff must be positive, got {args.max_backoff}")
    # The agent retries an unreachable coordinator for ever: a typo must not.
    if problem := dial_problem(args.coordinator):
        raise ConfigError(f"--coordinator {args.coordinator!r} {problem}")
    return AgentConfig(
        coordinator=args.coordinator,
        name=name,
        labels=args.labels,
        spool=args.spool,
        work_dir=args.work_dir or args.spool / f"agent-{name}",
        backends=backends,
        dcgm=dcgm.config_from_args(args),
        upload_limit_bps=args.upload_limit * 1e6 if args.upload_limit else None,
        max_backoff_s=args.max_backoff,
        tls=tls.client_files(args),
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    agent = Agent(config)  # first: TLS files or a DCGM named that fail it leave no folder made
    try:
        # Every folder checked before any is made: a file for --work-dir left the spool made, one
        # for the DCGM pause ledger (found as the agent ran) both.
        for folder in (config.spool, config.work_dir):
            output.check_folder(folder)
        agent.pauses.check()
        for folder in (config.spool, config.work_dir):
            output.make_folder(folder)
        agent.hold.acquire()  # before the banner: a second agent on the folder says only why it stops
    except RankscopeError:
        agent.close()
        raise

    def stop(signum, frame) -> None:
        # Resuming DCGM happens on the way out (Agent.close), never skipped by a signal; the
        # captures in flight end before, each telling the coordinator why.
        log.warning("signal %d: stopping the agent", signum)
        agent.halt(f"agent stopped by {signal.Signals(signum).name}")

    signals.on_stop(stop)
    control = agent.pauses.control
    print(f"rankscope agent {agent.config.name} (pid {os.getpid()}) -> {agent.config.coordinator}; "
          f"DCGM: {control.describe()}" + (f" ({control.error})" if isinstance(control, dcgm.NoDcgm) else ""), flush=True)
    if isinstance(control, dcgm.NoDcgm) and config.dcgm.mode in ("bindings", "dcgmi"):
        # Asked for by name, so expected here: captures will run, but without pausing DCGM.
        log.warning("--dcgm %s, yet %s: captures will not pause DCGM profiling", config.dcgm.mode, control.error)
    agent.run()
    return 0

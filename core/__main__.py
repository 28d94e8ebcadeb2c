from rankscope.cli import run

raise SystemExit(run())

"""Generate the committed gRPC stubs in proto/v1/ from proto/v1/*.proto.

The .proto files are copied into a temporary tree ``rankscope/proto/v1/`` and compiled with
``-I <tmp>``, so generated code imports ``from rankscope.proto.v1 import rankscope_pb2``
(the installed name) rather than a bare ``rankscope_pb2`` (grpc#29390, fixed as in grpc#29459).
Each stub's first line names its .proto's sha256, so a change protoc would not carry into the
code (a comment) still makes the stubs stale; tests/test_protos_fresh.py regenerates into a
temporary folder and compares.

Usage: python scripts/gen_protos.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "v1"
PACKAGE_PATH = Path("rankscope") / "proto" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto/v1/*.proto; write the stubs into ``out_dir``; return their paths."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        package = tree / PACKAGE_PATH
        package.mkdir(parents=True)
        for proto in protos:
            shutil.copy(proto, package / proto.name)
        # grpc_tools ships the well-known types (health, empty, ...) under its own include dir.
        well_known = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{tree}",
            f"-I{well_known}",
            f"--python_out={tree}",
            f"--pyi_out={tree}",
            f"--grpc_python_out={tree}",
            *(str(PACKAGE_PATH / p.name) for p in protos),
        ]
        # protoc resolves the relative .proto paths against the -I roots; run from the tree.
        cwd = Path.cwd()
        try:
            os.chdir(tree)
            if protoc.main(args) != 0:
                raise SystemExit("protoc failed (see its message above)")
        finally:
            os.chdir(cwd)
        sources = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in protos}
        for path in sorted(package.iterdir()):
            if path.name.endswith(GENERATED_SUFFIXES):
                stem = path.name.split("_pb2", 1)[0]
                target = out_dir / path.name
                target.write_text(f"# from {stem}.proto, sha256 {sources[stem]}\n" + path.read_text())
                written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="where to write the stubs (default: proto/v1)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

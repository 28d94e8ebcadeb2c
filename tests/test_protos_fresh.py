"""The committed gRPC stubs match what scripts/gen_protos.py makes from the .proto files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gen_protos():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    generated = _gen_protos().generate(tmp_path)
    assert generated, "no stubs generated"
    stale = [
        path.name
        for path in generated
        if not (ROOT / "proto" / "v1" / path.name).is_file()
        or (ROOT / "proto" / "v1" / path.name).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"stale generated stubs {stale}: run `python scripts/gen_protos.py` and commit"


def test_generated_code_imports_under_the_package_name() -> None:
    text = (ROOT / "proto" / "v1" / "rankscope_pb2_grpc.py").read_text()
    assert "from rankscope.proto.v1 import rankscope_pb2" in text

"""The committed gRPC stubs match what scripts/gen_protos.py makes from the .proto files,
and the package's dependencies admit only runtimes that load them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "proto" / "v1"


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
        if not (STUBS / path.name).is_file() or (STUBS / path.name).read_bytes() != path.read_bytes()
    ]
    tools = importlib.metadata.version("grpcio-tools")
    assert not stale, (f"stale generated stubs {stale} (made here with grpcio-tools {tools}, which pyproject's dev "
                       "extra pins): run `python scripts/gen_protos.py` and commit")


def test_generated_code_imports_under_the_package_name() -> None:
    text = (STUBS / "rankscope_pb2_grpc.py").read_text()
    assert "from rankscope.proto.v1 import rankscope_pb2" in text


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _floors() -> dict[str, tuple[int, ...]]:
    """Each runtime dependency's lower bound, as pyproject.toml states it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,.*)?", requirement)
        if match:
            floors[match.group(1)] = _version(match.group(2))
    return floors


def test_dependency_floors_admit_only_runtimes_that_load_the_stubs() -> None:
    """Generated code refuses, at import, a grpcio older than the grpcio-tools that made it
    (GRPC_GENERATED_VERSION) and a protobuf older than its gencode: a floor below either lets
    pip keep a runtime with which no rankscope command starts."""
    grpc_stamp = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", (STUBS / "rankscope_pb2_grpc.py").read_text())
    protobuf_stamp = re.search(r"# Protobuf Python Version: ([0-9.]+)", (STUBS / "rankscope_pb2.py").read_text())
    assert grpc_stamp and protobuf_stamp, "the stubs no longer state the versions they need"
    floors = _floors()
    assert floors["grpcio"] >= _version(grpc_stamp.group(1)), f"grpcio floor below the stubs' {grpc_stamp.group(1)}"
    assert floors["protobuf"] >= _version(protobuf_stamp.group(1)), \
        f"protobuf floor below the stubs' gencode {protobuf_stamp.group(1)}"

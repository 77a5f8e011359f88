"""`make proto`: the Python stubs in web/rpc/v1/ from web/rpc/proto/ (grpc_tools, a test
dependency: the stubs are checked in, and tests/test_grpc.py checks that generating them again
gives the same files). `python -m web.rpc.protoc [OUT_DIR]` writes them to OUT_DIR (default:
web/rpc/v1/)."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
PROTO = "whisperq/v1/transcription.proto"
STUBS = HERE / "v1"
FILES = ("transcription_pb2.py", "transcription_pb2.pyi", "transcription_pb2_grpc.py")
# protoc names the messages' module by the .proto's path (`from whisperq.v1 import ...`); the
# stubs live in web.rpc.v1, beside it, so the import is made relative.
_ABSOLUTE = re.compile(r"^from whisperq\.v1 import (\w+_pb2) as", re.MULTILINE)


def generate(out_dir: Path = STUBS) -> list[Path]:
    """Run protoc (grpc_tools) on the .proto and write the stubs to `out_dir`; their paths."""
    from importlib.resources import files

    from grpc_tools import protoc

    includes = str(files("grpc_tools") / "_proto")  # google/protobuf/*.proto
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{includes}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            PROTO,
        ]
        if protoc.main(argv) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_ROOT / PROTO}")
        written = []
        for name in FILES:
            text = (Path(tmp) / "whisperq" / "v1" / name).read_text()
            text = _ABSOLUTE.sub(r"from . import \1 as", text)
            target = out_dir / name
            target.write_text(text)
            written.append(target)
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else STUBS):
        print(path)

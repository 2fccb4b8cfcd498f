#!/usr/bin/env bash
# Regenerates tf_fusedrec/serve/embedding_pb2.py from tf_fusedrec/serve/embedding.proto.
#
#   scripts/gen_proto.sh            write embedding_pb2.py
#   scripts/gen_proto.sh --check    exit 1 if the committed embedding_pb2.py differs from what the .proto generates
#
# The protoc of grpcio-tools 1.62.x emits code for the protobuf 4.25 runtime that the project pins; newer
# grpcio-tools emit code that needs a newer runtime. grpcio-tools is only needed here (the server and the client use
# grpc's generic handlers and the generated messages, never grpcio-tools), so it is installed once into a directory of
# its own ($GRPC_TOOLS_DIR) instead of the project's environment. $PYTHON: the interpreter (default: .venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
TOOLS_VERSION="1.62.3"
TOOLS_DIR="${GRPC_TOOLS_DIR:-/tmp/grpc_tools-$TOOLS_VERSION}"
PROTO="tf_fusedrec/serve/embedding.proto"
GENERATED="tf_fusedrec/serve/embedding_pb2.py"

# requirements.txt installs grpcio-tools into .venv; another interpreter gets it in a directory of its own.
if "$PYTHON" -c "import grpc_tools.protoc" 2>/dev/null; then
  TOOLS_DIR=""
elif ! PYTHONPATH="$TOOLS_DIR" "$PYTHON" -c "import grpc_tools.protoc" 2>/dev/null; then
  echo "installing grpcio-tools==$TOOLS_VERSION into $TOOLS_DIR" >&2
  "$PYTHON" -m pip install --quiet --no-deps --target "$TOOLS_DIR" "grpcio-tools==$TOOLS_VERSION"
fi

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
# -I the repository root: the generated module registers the file as tf_fusedrec/serve/embedding.proto, a name no
# other .proto in the process can take.
(cd "$ROOT" && PYTHONPATH="$TOOLS_DIR" "$PYTHON" -m grpc_tools.protoc -I. --python_out="$OUT" "$PROTO")

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u "$ROOT/$GENERATED" "$OUT/$GENERATED"; then
    echo "$GENERATED is out of date with $PROTO: run scripts/gen_proto.sh" >&2
    exit 1
  fi
  echo "$GENERATED is up to date"
else
  cp "$OUT/$GENERATED" "$ROOT/$GENERATED"
  echo "wrote $GENERATED"
fi

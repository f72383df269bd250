#!/usr/bin/env bash
# Regenerates the committed protobuf/gRPC modules from proto/*.proto (needs grpcio-tools, a dev dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
$py -m grpc_tools.protoc -Iproto --python_out=relay/proto --pyi_out=relay/proto proto/remote_v1.proto proto/remote_v2.proto
$py -m grpc_tools.protoc -Iproto --python_out=exporter/proto --pyi_out=exporter/proto --grpc_python_out=exporter/proto proto/podresources_v1.proto
# grpc_tools emits absolute imports; make them package-relative.
sed -i 's/^import podresources_v1_pb2 as/from . import podresources_v1_pb2 as/' exporter/proto/podresources_v1_pb2_grpc.py

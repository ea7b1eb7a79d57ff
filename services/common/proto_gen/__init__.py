"""Generated protobuf / gRPC code of ``protos/tailspec/v1`` (checked in; regenerate with ``make protos``).

    from services.common.proto_gen.tailspec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

The ``tailspec/`` tree is written by ``generate.py``; do not edit it by hand.
"""

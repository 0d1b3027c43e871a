"""The kubelet's pod-resources API, v1: its ``api.proto`` and the code protoc made from it.

Generated (``make kubelet-proto``): never edit ``api_pb2*``. Imports ``google.protobuf``
and ``grpc`` (the ``kubelet`` extra).
"""

"""The ``List`` answer decoded from protobuf's wire format: the fields attribution reads.

``v1/api.proto`` is the contract and ``v1``'s generated code serves it in the tests'
throwaway kubelet; the agent decodes the answer here instead, because the protobuf
runtime costs 2.4 MB of the agent's 40 MB for four messages of which it reads six
fields. The wire format is protobuf's documented encoding
(https://protobuf.dev/programming-guides/encoding/): each field a varint key (number << 3
| wire type) and a varint, a fixed 4 or 8 bytes, or a length-prefixed run; fields not
read here (CPU ids, memory, topology, dynamic resources, any field a newer kubelet adds)
are skipped by their wire type, as protobuf's own parsers skip unknown fields.

Read (field numbers from api.proto): ``ListPodResourcesResponse.pod_resources`` (1);
``PodResources.name`` (1), ``.namespace`` (2), ``.containers`` (3);
``ContainerResources.name`` (1), ``.devices`` (2); ``ContainerDevices.resource_name`` (1),
``.device_ids`` (2). The attribute names are the generated classes' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
#: A varint is at most 10 bytes (64 bits, 7 a byte).
_VARINT_BYTES = 10


class WireError(ValueError):
    """The bytes are not a protobuf message of the expected shape (truncated, bad UTF-8)."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


@dataclass(frozen=True, slots=True)
class ListPodResourcesResponse:
    pod_resources: tuple[PodResources, ...]


def decode_list_answer(data: bytes) -> ListPodResourcesResponse:
    """``List``'s answer; WireError for bytes that do not decode."""
    return ListPodResourcesResponse(tuple(
        _pod(value) for number, value in _fields(memoryview(data)) if number == 1))


def _pod(data: memoryview) -> PodResources:
    name = namespace = ""
    containers: list[ContainerResources] = []
    for number, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2:
            namespace = _text(value)
        elif number == 3:
            containers.append(_container(value))
    return PodResources(name, namespace, tuple(containers))


def _container(data: memoryview) -> ContainerResources:
    name = ""
    devices: list[ContainerDevices] = []
    for number, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2:
            devices.append(_devices(value))
    return ContainerResources(name, tuple(devices))


def _devices(data: memoryview) -> ContainerDevices:
    resource = ""
    ids: list[str] = []
    for number, value in _fields(data):
        if number == 1:
            resource = _text(value)
        elif number == 2:
            ids.append(_text(value))
    return ContainerDevices(resource, tuple(ids))


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    """Each length-delimited field as (number, bytes); other wire types skipped."""
    at, end = 0, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == _VARINT:
            _, at = _varint(data, at)
        elif wire_type == _FIXED64:
            at += 8
        elif wire_type == _FIXED32:
            at += 4
        elif wire_type == _LENGTH:
            length, at = _varint(data, at)
            if at + length > end:
                raise WireError(f"field {number} runs {at + length - end} bytes past the end")
            yield number, data[at:at + length]
            at += length
        else:
            raise WireError(f"field {number} has wire type {wire_type} (groups or invalid)")
        if at > end:
            raise WireError(f"field {number} runs past the end")


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    for offset in range(_VARINT_BYTES):
        if at + offset >= len(data):
            raise WireError("a varint runs past the end")
        byte = data[at + offset]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at + offset + 1
        shift += 7
    raise WireError("a varint longer than 10 bytes")


def _text(value: memoryview) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireError(f"a string that is not UTF-8: {err}") from None

"""The one config loader: YAML -> validated, typed settings.

Every error names the file, the key path and the line, so that an operator can fix a
bad file without reading a traceback. Settings are plain dataclasses (grouped, with safe
defaults); :func:`bind` fills one from a YAML mapping and rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from sn_monitor.errors import SnMonitorError

T = TypeVar("T")
KeyPath = tuple[str | int, ...]


class ConfigError(SnMonitorError):
    """A bad config file: which file, which key, which line, and what is wrong."""

    def __init__(self, file: str, key: str, line: int | None, message: str) -> None:
        self.file = file
        self.key = key
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class Duration(float):
    """Seconds, written in YAML as ``1s``, ``500ms``, ``5m``, ``1h30m`` or a plain number."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Parse a duration; raise ValueError with a readable message."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 1s or 500ms, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value}")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    raise ValueError(f"expected a duration such as 1s or 500ms, got {value!r}")


def parse_duration_text(text: str) -> float:
    """A duration typed as text (a CSV cell, a command-line option): ``90`` or ``1h30m``."""
    try:
        return parse_duration(float(text))
    except ValueError:
        return parse_duration(text)


@dataclass(frozen=True)
class Document:
    """A parsed YAML file with the line of every key path."""

    path: str
    data: Any
    lines: dict[KeyPath, int]

    def line(self, key: KeyPath) -> int | None:
        """The line of ``key``, or of its nearest ancestor that has one."""
        for cut in range(len(key), -1, -1):
            found = self.lines.get(key[:cut])
            if found is not None:
                return found
        return None

    def error(self, key: KeyPath, message: str) -> ConfigError:
        """A ConfigError pointing at ``key`` in this document."""
        return ConfigError(self.path, format_key(key), self.line(key), message)


def format_key(key: KeyPath) -> str:
    """``("collectors", "net", "exclude")`` -> ``collectors.net.exclude``; ints as ``[i]``."""
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def parse_yaml(text: str, path: str) -> Document:
    """Parse YAML text into a Document; syntax errors become ConfigError with a line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = err.problem or err.context or "invalid YAML"
        raise ConfigError(path, "", line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(path, "", None, f"invalid YAML: {err}") from None
    except RecursionError:
        raise ConfigError(path, "", None, "invalid YAML: nested too deeply") from None
    lines: dict[KeyPath, int] = {}
    try:
        data = _to_python(node, (), lines, path)
    except RecursionError:  # a recursive alias, or nesting deeper than Python's stack
        raise ConfigError(path, "", None, "nested too deeply (or a recursive alias)") from None
    except ValueError as err:  # e.g. an integer with thousands of digits
        raise ConfigError(path, "", None, f"a value cannot be read: {err}") from None
    return Document(path=path, data=data, lines=lines)


def load_yaml(path: str | Path) -> Document:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "", None, "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(name, "", None, f"cannot read: {err}") from None
    return parse_yaml(text, name)


def _to_python(node: yaml.Node | None, key: KeyPath, lines: dict[KeyPath, int], path: str) -> Any:
    if node is None:
        return None
    lines.setdefault(key, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            name = yaml.SafeLoader(  # construct scalars exactly as safe_load would
                ""
            ).construct_object(knode)
            if not isinstance(name, str | int):
                raise ConfigError(path, format_key(key), knode.start_mark.line + 1,
                                  f"keys must be strings, got {name!r}")
            if name in out:
                raise ConfigError(path, format_key((*key, name)), knode.start_mark.line + 1,
                                  "duplicate key")
            lines[(*key, name)] = knode.start_mark.line + 1
            out[name] = _to_python(vnode, (*key, name), lines, path)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*key, i), lines, path) for i, item in enumerate(node.value)]
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    except yaml.constructor.ConstructorError as err:
        line = node.start_mark.line + 1
        raise ConfigError(path, format_key(key), line, str(err.problem)) from None


Check = Callable[[Any], None]


def positive(value: float) -> None:
    """A check for ``setting(check=...)``: greater than 0."""
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {value}")


def non_negative(value: float) -> None:
    """A check for ``setting(check=...)``: 0 or more."""
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")


def at_least_one(value: int) -> None:
    """A check for ``setting(check=...)``: a count of at least 1."""
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")


def fraction(value: float) -> None:
    """A check for ``setting(check=...)``: a share in (0, 1]."""
    if not 0 < value <= 1:
        raise ValueError(f"must be a fraction in (0, 1], got {value}")


def optional(check: Check) -> Check:
    """``check`` for a setting that may be left out: None passes, anything else is checked."""
    def check_given(value: Any) -> None:
        if value is not None:
            check(value)
    return check_given


def listen_address(value: str) -> None:
    """A check for ``setting(check=...)`` and ``--listen``: ``HOST:PORT``, port 1-65535."""
    _, port = parse_listen(value)
    if port == 0:
        raise ValueError(f"port 0 is out of range 1-65535 (in {value!r})")


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def parse_listen(value: str) -> tuple[str, int]:
    """``0.0.0.0:9847`` -> (``0.0.0.0``, 9847); ``[::1]:9847`` -> (``::1``, 9847).

    Raises ValueError saying what is wrong: no port, a port outside 0-65535 (0: any free
    port, which only code asks for), a host that is neither an IP address nor a host
    name. The name is not looked up here: that is the bind's job, and its error says so.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (such as 0.0.0.0:9847), got {value!r}")
    if not (port.isascii() and port.isdigit()):
        raise ValueError(f"the port must be a number 1-65535, got {port!r} (in {value!r})")
    if int(port) > 65535:
        raise ValueError(f"port {int(port)} is out of range 1-65535 (in {value!r})")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address (in {value!r})") from None
        return host[1:-1], int(port)
    if ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, as [::1]:9847; got {value!r}")
    labels = host.removesuffix(".").split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host} is not an IPv4 address (in {value!r})") from None
    elif len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{host!r} is neither an IP address nor a host name (in {value!r})")
    return host, int(port)


def setting(*, key: str | None = None, check: Check | None = None, **kwargs: Any) -> Any:
    """A dataclass field with a YAML name (``key``, e.g. ``for``) and a validator.

    ``check(value)`` raises ValueError to reject a value; the message reaches the user
    with the file, key path and line.
    """
    metadata: dict[str, Any] = {}
    if key is not None:
        metadata["key"] = key
    if check is not None:
        metadata["check"] = check
    return dataclasses.field(metadata=metadata, **kwargs)


def bind(cls: type[T], doc: Document, data: Any = dataclasses.MISSING, key: KeyPath = ()) -> T:
    """Build settings dataclass ``cls`` from ``data`` (default: the whole document)."""
    value = doc.data if data is dataclasses.MISSING else data
    if value is None:
        value = {}
    return typing.cast(T, _convert(cls, value, doc, key))


def _convert(tp: Any, value: Any, doc: Document, key: KeyPath) -> Any:
    """``value`` read from ``doc`` at ``key`` as type ``tp``; ConfigError says what is wrong."""
    generic = _GENERICS.get(get_origin(tp))
    if generic is not None:
        return generic(get_args(tp), value, doc, key)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, doc, key)
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        return scalar(value, doc, key)
    if tp is Any:
        return value
    raise TypeError(f"settings type {tp!r} is not supported by the loader")


def _convert_union(options: tuple[Any, ...], value: Any, doc: Document, key: KeyPath) -> Any:
    """The first of ``options`` that takes ``value`` (``None`` for an optional setting)."""
    if value is None and type(None) in options:
        return None
    real = [o for o in options if o is not type(None)]
    if len(real) == 1:
        return _convert(real[0], value, doc, key)
    errors = []
    for option in real:
        try:
            return _convert(option, value, doc, key)
        except ConfigError as err:
            errors.append(err.message)
    got = (f", got {value!r}", f"; got {value!r}")
    if all(e.endswith(got) for e in errors):  # say what was given once, at the end
        errors = [e[:-len(got[0])] if e.endswith(got[0]) else e[:-len(got[1])]
                  for e in errors]
        raise doc.error(key, f"{' or '.join(errors)}; got {value!r}")
    raise doc.error(key, " or ".join(errors))


def _convert_literal(allowed: tuple[Any, ...], value: Any, doc: Document,
                     key: KeyPath) -> Any:
    if value not in allowed:
        if len(allowed) == 1:
            raise doc.error(key, f"must be {allowed[0]}; got {value!r}")
        raise doc.error(key, f"must be one of {', '.join(map(str, allowed))}; got {value!r}")
    return value


def _convert_list(args: tuple[Any, ...], value: Any, doc: Document, key: KeyPath) -> Any:
    (item,) = args
    if not isinstance(value, list):
        raise doc.error(key, f"expected a list, got {_kind(value)}")
    return [_convert(item, v, doc, (*key, i)) for i, v in enumerate(value)]


def _convert_dict(args: tuple[Any, ...], value: Any, doc: Document, key: KeyPath) -> Any:
    ktype, vtype = args
    if not isinstance(value, dict):
        raise doc.error(key, f"expected a mapping, got {_kind(value)}")
    return {
        _convert(ktype, k, doc, (*key, k)): _convert(vtype, v, doc, (*key, k))
        for k, v in value.items()
    }


def _convert_duration(value: Any, doc: Document, key: KeyPath) -> Any:
    try:
        return Duration(parse_duration(value))
    except ValueError as err:
        raise doc.error(key, str(err)) from None


def _convert_bool(value: Any, doc: Document, key: KeyPath) -> Any:
    if not isinstance(value, bool):
        raise doc.error(key, f"expected true or false, got {value!r}")
    return value


def _convert_int(value: Any, doc: Document, key: KeyPath) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(key, f"expected an integer, got {value!r}")
    return value


def _convert_float(value: Any, doc: Document, key: KeyPath) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise doc.error(key, f"expected a number, got {value!r}")
    return float(value)


def _convert_str(value: Any, doc: Document, key: KeyPath) -> Any:
    if not isinstance(value, str):
        raise doc.error(key, f"expected a string, got {value!r}")
    return value


#: A generic settings type's converter, by its origin (``list[int]``: list), given its
#: arguments.
_GENERICS: dict[Any, Callable[[tuple[Any, ...], Any, Document, KeyPath], Any]] = {
    Union: _convert_union,
    types.UnionType: _convert_union,
    Literal: _convert_literal,
    list: _convert_list,
    dict: _convert_dict,
}
#: A plain settings type's converter.
_SCALARS: dict[Any, Callable[[Any, Document, KeyPath], Any]] = {
    Duration: _convert_duration,
    bool: _convert_bool,
    int: _convert_int,
    float: _convert_float,
    str: _convert_str,
}


def _convert_dataclass(cls: type, value: Any, doc: Document, key: KeyPath) -> Any:
    if not isinstance(value, dict):
        raise doc.error(key, f"expected a mapping, got {_kind(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise unknown_key(doc, (*key, unknown[0]), sorted(fields))
    kwargs: dict[str, Any] = {}
    for yaml_name, field in fields.items():
        if yaml_name not in value:
            if (field.default is dataclasses.MISSING
                    and field.default_factory is dataclasses.MISSING):
                raise doc.error(key, f"missing required key '{yaml_name}'")
            continue
        converted = _convert(hints[field.name], value[yaml_name], doc, (*key, yaml_name))
        validator = field.metadata.get("check")
        if validator is not None:
            try:
                validator(converted)
            except ValueError as err:
                raise doc.error((*key, yaml_name), str(err)) from None
        kwargs[field.name] = converted
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise doc.error(key, str(err)) from None


def unknown_key(doc: Document, key: KeyPath, known: Sequence[str]) -> ConfigError:
    """The error for ``key`` (its last part not one of ``known``): the likely key first.

    ``sweep_intervall: unknown key; did you mean sweep_interval? (known keys: ...)``
    """
    close = difflib.get_close_matches(str(key[-1]), known, n=1)
    guess = f"; did you mean {close[0]}?" if close else ""
    return doc.error(key, f"unknown key{guess} (known keys: {', '.join(known)})")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)

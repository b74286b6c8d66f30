"""Loading dataclass specs from YAML/JSON with schema validation and one-line errors.

Hardware profiles and policies are written by people and by tools; every malformed field must name
itself in the error instead of surfacing as a TypeError deep inside the simulator.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slidedp.errors import SlideDPError

T = TypeVar("T")


def read_mapping(path: str | Path, what: str) -> dict:
    """Parse a YAML or JSON file that must hold a mapping."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SlideDPError(f"cannot read {what} file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SlideDPError(f"malformed {what} file {str(path)!r}: {first}") from None
    if not isinstance(data, dict):
        raise SlideDPError(f"{what} file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def write_mapping(path: str | Path, data: dict) -> None:
    """Write YAML (or JSON for a .json suffix) atomically enough for configs: temp file then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, indent=2) if path.suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    tmp.write_text(text)
    tmp.replace(path)


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _convert(value, non_none[0], where)
    if origin is typing.Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise SlideDPError(f"{where}: {value!r} is not one of {choices}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SlideDPError(f"{where}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SlideDPError(f"{where}: expected a mapping, got {type(value).__name__}")
        kt, vt = args
        return {_convert(k, kt, f"{where} key") : _convert(v, vt, f"{where}[{k}]") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise SlideDPError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SlideDPError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SlideDPError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SlideDPError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_mapping(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys, missing keys and wrong types."""
    if not isinstance(data, dict):
        raise SlideDPError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise SlideDPError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(fields)})")
    kwargs = {}
    for name, field in fields.items():
        if name not in data:
            no_default = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            if no_default:
                raise SlideDPError(f"{where}: missing required key {name!r}")
            continue
        kwargs[name] = _convert(data[name], hints[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except SlideDPError as exc:
        raise SlideDPError(f"{where}: {exc}") from None


def to_mapping(obj: Any) -> Any:
    """Plain-data view of a (nested) dataclass, suitable for YAML."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj

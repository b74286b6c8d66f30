"""Loading dataclass specs from YAML/JSON with schema validation and one-line errors.

Hardware profiles and policies are written by people and by tools; every malformed field must name
itself in the error instead of surfacing as a TypeError deep inside the simulator.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slidedp.errors import SlideDPError

T = TypeVar("T")

MAX_INT = 10**15  # no count or size in a config is larger; 5,000-digit integers are refused before any use
MAX_CONFIG_BYTES = 4 * 2**20  # policies and profiles are a few KB; a larger file is not a config
MAX_ALIASES = 64  # YAML anchors are fine; thousands of alias uses are an expansion bomb
QUOTE_CHARS = 60


def quote(value: Any) -> str:
    """A bad value as an error message shows it: its repr, cut to a short prefix (never megabytes)."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + f"... ({len(text)} chars)"


class DuplicateKey(ValueError):
    """A key given twice in one mapping of a config: YAML and JSON keep the last silently; refused instead."""


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(f"key {key!r} is given twice")
        seen[key] = value
    return seen


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (a policy with two param_route lines)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor``: its keys may be overridden here, which is not a key given twice
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the base loader names that error
            if key in seen:
                raise DuplicateKey(f"key {key!r} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_mapping(path: str | Path, what: str) -> dict:
    """Parse a YAML or JSON file that must hold a mapping."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # /dev/zero, a FIFO, a directory
            raise SlideDPError(f"{what} {str(path)!r} is not a regular file")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise SlideDPError(f"{what} file {str(path)!r} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: "
                               f"not a configuration")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SlideDPError(f"cannot read {what} file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_json_keys)
        else:
            aliases = sum(isinstance(t, yaml.AliasToken) for t in yaml.scan(text, Loader=yaml.SafeLoader))
            if aliases > MAX_ALIASES:
                raise SlideDPError(f"{what} file {str(path)!r} uses {aliases} YAML aliases (at most {MAX_ALIASES}): "
                                   f"refusing an expansion bomb")
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader that refuses duplicate keys
    except RecursionError:
        raise SlideDPError(f"malformed {what} file {str(path)!r}: nested too deeply") from None
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError is a ValueError, so are 5,000-digit integers
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SlideDPError(f"malformed {what} file {str(path)!r}: {first}") from None
    if data is None:
        raise SlideDPError(f"{what} file {str(path)!r} is empty (it must hold a mapping of settings)")
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


def _json_key(key: Any, hint: Any) -> Any:
    """A mapping key as its type: JSON writes every key as a string, so an integer-keyed map (update rates by
    thread count) that write_mapping saved as JSON reads back with "8" for 8."""
    if hint is int and isinstance(key, str) and re.fullmatch(r"-?\d{1,16}", key):
        return int(key)
    return key


def _yaml11_exponent(value: Any) -> Any:
    """A number YAML 1.1 leaves a string (an exponent without a dot: ``1e30``, ``5e-3``) as the number meant."""
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+[eE][-+]?\d+", value.strip()):
        return float(value)
    return value


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
            raise SlideDPError(f"{where}: {quote(value)} is not one of {choices}")
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
        return {_convert(_json_key(k, kt), kt, f"{where} key") : _convert(v, vt, f"{where}[{k}]")
                for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise SlideDPError(f"{where}: expected true/false, got {quote(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_INT:
            raise SlideDPError(f"{where}: expected an integer (at most {MAX_INT:.0e}), got {quote(value)}")
        return value
    if hint is float:
        value = _yaml11_exponent(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int)
                                                                             and abs(value) > MAX_INT):
            raise SlideDPError(f"{where}: expected a number, got {quote(value)}")
        if not math.isfinite(float(value)):
            raise SlideDPError(f"{where}: expected a finite number, got {quote(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SlideDPError(f"{where}: expected a string, got {quote(value)}")
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
        raise SlideDPError(f"{where}: unknown key {quote(unknown[0])} (known: {', '.join(fields)})")
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

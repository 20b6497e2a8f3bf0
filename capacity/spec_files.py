"""TOML/JSON spec files (workloads, topologies) decoded into msgspec structs.

Unknown keys are reported as warnings and ignored; a wrong type fails with the key's path
(`arrivals.rate: expected float, got str`), as a SimulationError.
"""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path
from typing import Any

import msgspec

from edge_sim.roofline import SimulationError


def read_spec_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise SimulationError(f"{path}: file not found") from None
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SimulationError(f"{path}: invalid JSON: {exc}") from None
    else:
        try:
            data = tomllib.loads(text.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SimulationError(f"{path}: invalid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise SimulationError(f"{path}: expected a table/object at the top level")
    return data


def _unknown_keys(data: Any, info: Any, path: str, out: list[str]) -> None:
    """Collect keys in `data` that the msgspec type `info` does not declare."""
    mi = msgspec.inspect
    if isinstance(info, mi.UnionType):
        structs = [t for t in info.types if isinstance(t, mi.StructType)]
        if len(structs) == 1:
            _unknown_keys(data, structs[0], path, out)
        return
    if isinstance(info, mi.StructType) and isinstance(data, dict):
        fields = {f.encode_name: f for f in info.fields}
        for key, value in data.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in fields:
                out.append(sub)
            else:
                _unknown_keys(value, fields[key].type, sub, out)
    elif isinstance(info, mi.ListType) and isinstance(data, list):
        for i, item in enumerate(data):
            _unknown_keys(item, info.item_type, f"{path}[{i}]", out)
    elif isinstance(info, mi.DictType) and isinstance(data, dict):
        for key, value in data.items():
            _unknown_keys(value, info.value_type, f"{path}.{key}", out)


def convert_spec(data: dict[str, Any], typ: type, source: str) -> Any:
    unknown: list[str] = []
    _unknown_keys(data, msgspec.inspect.type_info(typ), "", unknown)
    for key in unknown:
        warnings.warn(f"{source}: unknown key {key!r} ignored", stacklevel=3)
    try:
        return msgspec.convert(data, typ)
    except msgspec.ValidationError as exc:
        raise SimulationError(f"{source}: {_validation_message(str(exc))}") from None


def _validation_message(text: str) -> str:
    """msgspec's "Expected `float`, got `str` - at `$.arrivals.rate`" becomes
    "arrivals.rate: expected float, got str"."""
    msg, sep, where = text.rpartition(" - at `")
    if not sep:
        return text.replace("`", "")
    key = where.rstrip("`").removeprefix("$").removeprefix(".") or "(top level)"
    msg = msg.replace("`", "")
    if msg.split(" ", 1)[0] in ("Expected", "Object", "Invalid"):  # msgspec's own sentences
        msg = msg[:1].lower() + msg[1:]
    return f"{key}: {msg}"

"""The configuration written back as TOML: ``edge-agent config show``, and the files tests and benchmarks give a daemon."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from edge_agent.alerts.config import WebhookSection
from edge_agent.config import AppConfig

__all__ = ["dump_toml", "sections_toml", "toml_value"]


def toml_value(v: Any) -> str:
    """One TOML value: a bool, number, string, list or inline table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table, keys quoted ("camera:0" is not a bare key)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_toml(cfg: AppConfig, comments: bool = True) -> str:
    """The configuration as TOML, each key preceded by its description and default."""
    out: list[str] = []
    for name, section in cfg:
        description = AppConfig.model_fields[name].description
        if not isinstance(section, list):
            _table(out, name, section, description, comments)
        elif section:
            for i, item in enumerate(section):
                _table(out, name, item, description if i == 0 else None, comments, array=True)
        elif comments:
            out.extend(_commented_example(name, description))
    return "\n".join(out)


def _commented_example(name: str, description: str | None) -> list[str]:
    """An empty ``[[name]]`` list shown as a commented example, so the option is found where the others are."""
    if name != "webhooks":
        return [f"# {description}", ""]
    example: list[str] = []
    _table(example, name, WebhookSection(url="https://ntfy.sh/my-farm-alerts", format="ntfy"), description, True, True)
    return [line if line.startswith("#") or not line else f"# {line}" for line in example]


def _table(out: list[str], name: str, section: BaseModel, description: str | None, comments: bool, array: bool = False) -> None:
    """``[name]`` (``[[name]]`` in an array) with its keys; a key holding a table follows as ``[name.key]``."""
    if comments and description:
        out.append(f"# {description}")
    out.append(f"[[{name}]]" if array else f"[{name}]")
    tables = []
    for key, field in type(section).model_fields.items():
        value = getattr(section, key)
        if isinstance(value, BaseModel):
            tables.append((key, value, field.description))
            continue
        if comments and field.is_required():
            out.append(f"# {field.description} Required.")
        elif comments:
            out.append(f"# {field.description} Default: {toml_value(field.get_default(call_default_factory=True))}.")
        out.append(f"{key} = {toml_value(value)}")
    out.append("")
    for key, value, desc in tables:
        _table(out, f"{name}.{key}", value, desc, comments)


def sections_toml(sections: dict[str, dict[str, Any]]) -> str:
    """``{"section": {"key": value}}`` as TOML tables, one ``[section]`` each (a dotted name for a nested one)."""
    return "".join(f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()) for name, values in sections.items())

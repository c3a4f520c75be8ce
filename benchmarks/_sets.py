"""A benchmark's ``--set SECTION.KEY=VALUE`` options as a configuration's sections (each value read as TOML)."""

from __future__ import annotations

__all__ = ["config_sets", "with_sets"]


def config_sets(items: list[str]) -> dict:
    """``["trainer.field_check_min=6"]`` as ``{"trainer": {"field_check_min": 6}}`` (each value read as TOML)."""
    from edge_agent.config import tomllib

    out: dict = {}
    for item in items:
        key, eq, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not (eq and dot and section and name):
            raise SystemExit(f"--set {item!r}: write SECTION.KEY=VALUE, e.g. trainer.field_check_min=6")
        try:
            out.setdefault(section, {})[name] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise SystemExit(f"--set {item!r}: the value is not TOML ({exc}); a string needs quotes: 'engine.precision=\"fp32\"'") from None
    return out


def with_sets(sections: dict, sets: dict | None) -> dict:
    """``sections`` with each of ``sets``'s values put in (a section named in both keeps its other keys)."""
    out = {name: dict(values) for name, values in sections.items()}
    for name, values in (sets or {}).items():
        out[name] = {**out.get(name, {}), **values}
    return out

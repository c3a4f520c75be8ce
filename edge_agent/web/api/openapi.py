"""The API's OpenAPI 3.1 document, built from the endpoint table and the pydantic models, and its Markdown reference.

python -m edge_agent.web.api            # the reference as Markdown (README's "JSON API" section)
python -m edge_agent.web.api --json     # the document itself, as /api/v1/openapi.json serves it
"""

from __future__ import annotations

from pydantic.json_schema import models_json_schema

from edge_agent import __version__
from edge_agent.web.api.endpoints import ENDPOINTS, Endpoint
from edge_agent.web.api.schemas import SCHEMAS

__all__ = ["PREFIX", "document", "reference"]

PREFIX = "/api/v1"
_ROLE_TEXT = {"read": "any token", "label": "a label or admin token", "admin": "an admin token"}


def _ref(model) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _operation(ep: Endpoint) -> dict:
    op: dict = {
        "summary": ep.summary,
        "operationId": ep.handler.__name__,
        "x-role": ep.role,
        "description": f"Needs {_ROLE_TEXT[ep.role]} (or a client on this machine when the page is bound to 127.0.0.1).",
        "responses": {
            "200": _json(ep.response, "OK"),
            **{str(k): _json(m, text) for k, (m, text) in ep.extra.items()},
            "400": _json(_problem(), "A parameter or the body is wrong (the error says which)."),
            "401": {"description": "No valid token."},
            "403": _json(_problem(), "The token's role may not do this, or a browser's POST lacks its CSRF token."),
            **{str(k): _json(_problem(), text) for k, text in ep.errors.items()},
        },
    }
    if ep.params:
        op["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "description": p.description,
                "schema": {"type": p.type, **({"pattern": p.pattern} if p.pattern else {})},
            }
            for p in ep.params
        ]
    if ep.body == "image":
        op["requestBody"] = {
            "required": True,
            "description": "The photo's bytes as the body, or a multipart form with the field 'photo'.",
            "content": {
                "image/*": {"schema": {"type": "string", "format": "binary"}},
                "multipart/form-data": {
                    "schema": {"type": "object", "properties": {"photo": {"type": "string", "format": "binary"}}, "required": ["photo"]}
                },
            },
        }
    elif ep.body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(ep.body)}}}
    return op


def _problem():
    from edge_agent.web.api.schemas import Problem

    return Problem


def document() -> dict:
    """The OpenAPI 3.1 document of every endpoint under :data:`PREFIX`."""
    _, defs = models_json_schema([(m, "serialization") for m in SCHEMAS], ref_template="#/components/schemas/{model}")
    paths: dict[str, dict] = {}
    for ep in ENDPOINTS:
        paths.setdefault(PREFIX + ep.path, {})[ep.method.lower()] = _operation(ep)
    paths[PREFIX + "/openapi.json"] = {
        "get": {"summary": "This document.", "operationId": "openapi", "x-role": "read", "responses": {"200": {"description": "OK"}}}
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "edge-agent",
            "version": __version__,
            "description": "The device's results, review queue, engines and health, for programs. Send a token made with "
            "`edge-agent web --new-token --role read|label|admin` as `Authorization: Bearer <token>`.",
        },
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {}), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }


def reference(doc: dict | None = None) -> str:
    """The document as a Markdown table per endpoint (what README's API reference is)."""
    doc = doc or document()
    out = ["| Method and path | Role | What it does | Parameters | Answers |", "|---|---|---|---|---|"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            params = ", ".join(f"`{p['name']}`" for p in op.get("parameters", []))
            body = op.get("requestBody", {}).get("content", {})
            if "application/json" in body:
                params = ", ".join(x for x in (params, "JSON " + body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]) if x)
            elif body:
                params = ", ".join(x for x in (params, "the photo") if x)
            codes = ", ".join(k for k in op["responses"] if k not in ("400", "401", "403"))
            out.append(f"| `{method.upper()} {path}` | {op.get('x-role', 'read')} | {op['summary']} | {params or '-'} | {codes} |")
    return "\n".join(out) + "\n"

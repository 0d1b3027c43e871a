"""The pieces of OpenAPI the routes' docs share: errors, plain JSON, names and ids.

Path parameters say what a name or an id looks like: anything else names nothing
(404), and the schema-driven fuzz (``tests/integration/test_api_fuzz.py``) tries it.
"""

from __future__ import annotations

from typing import Any, Final

from sn_monitor.model import NODE_NAME_MAX_LENGTH, NODE_NAME_PATTERN

ERROR: Final[dict[str, Any]] = {
    "description": "error", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}
ANY_JSON: Final[dict[str, Any]] = {
    "description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}

NODE_NAME: Final[dict[str, Any]] = {
    "type": "string", "minLength": 1, "maxLength": NODE_NAME_MAX_LENGTH,
    "pattern": NODE_NAME_PATTERN}
JOB_NAME: Final[dict[str, Any]] = {
    "type": "string", "minLength": 1, "maxLength": 63,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
HEX_ID: Final[dict[str, Any]] = {
    "type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9a-f]+$"}

#: ``?limit=``, as every listing takes it (:meth:`~.call.Call.limit`).
LIMIT: Final[dict[str, Any]] = {
    "name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                               "maximum": 1000}}
#: ``?node=``, the filter most listings take.
NODE_FILTER: Final[dict[str, Any]] = {"name": "node", "in": "query",
                                      "schema": {"type": "string"}}
LISTING: Final = (LIMIT, NODE_FILTER)


def path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A required path parameter."""
    return {"name": name, "in": "path", "required": True, "schema": schema}


def query_param(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """An optional query parameter (a string unless ``schema`` says otherwise)."""
    return {"name": name, "in": "query", "schema": schema or {"type": "string"}}


def json_body(schema: str) -> dict[str, Any]:
    """A required JSON request body of the component schema ``schema``."""
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema}"}}}}


#: What a body-reading route refuses: malformed, too large, not JSON, invalid.
BODY_ERRORS: Final[dict[str, Any]] = {"400": ERROR, "413": ERROR, "415": ERROR,
                                      "422": ERROR}

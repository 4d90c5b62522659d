"""The OpenAPI 3 description the demo publishes at ``/api-docs``."""

from __future__ import annotations

_PAGING = [
    {
        "name": "skip",
        "in": "query",
        "required": False,
        "description": "Number of items skipped before collecting (default 0).",
        "schema": {"type": "integer", "minimum": 0, "default": 0},
    },
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "Maximum items per page (default 100). The server may cap it silently.",
        "schema": {"type": "integer", "minimum": 0, "default": 100},
    },
]

_ERRORS = {
    "400": "Invalid query parameter",
    "401": "Missing, unknown or replaced bearer token",
    "429": "Too many requests (may carry Retry-After)",
    "5XX": "Server or gateway error (may carry Retry-After)",
}


def _errors() -> dict:
    return {
        code: {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for code, description in _ERRORS.items()
    }


def _ok(schema: dict, description: str = "OK") -> dict:
    return {
        "200": {"description": description, "content": {"application/json": {"schema": schema}}}
    }


def build_openapi() -> dict:
    ref = "#/components/schemas/"
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Field-Sales Event and Transaction Read API (demo instance)",
            "version": "v1",
            "description": (
                "Synthetic, deterministic demo of the Field-Sales read API. All endpoints but "
                "this document require `Authorization: Bearer <token>`."
            ),
        },
        "security": [{"bearerAuth": []}],
        "paths": {
            "/public/v1/api/transaction/all": {
                "get": {
                    "summary": "List transactions",
                    "operationId": "listTransactions",
                    "parameters": [
                        *_PAGING,
                        {
                            "name": "eventId",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string"},
                            "description": "Only transactions of this event.",
                        },
                        {
                            "name": "type",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "default": "sale"},
                            "description": "Transaction type; every demo transaction is a sale.",
                        },
                    ],
                    "responses": {
                        **_ok({"$ref": ref + "TransactionList"}),
                        **_errors(),
                    },
                }
            },
            "/public/v1/api/event/all": {
                "get": {
                    "summary": "List events",
                    "operationId": "listEvents",
                    "description": (
                        "A bare JSON list of events by default; the envelope is not part of the "
                        "documented contract."
                    ),
                    "parameters": list(_PAGING),
                    "responses": {
                        **_ok({"type": "array", "items": {"$ref": ref + "Event"}}),
                        **_errors(),
                    },
                }
            },
            "/public/v1/api/eventgroup/all": {
                "get": {
                    "summary": "List event groups",
                    "operationId": "listEventGroups",
                    "parameters": [
                        *_PAGING,
                        {
                            "name": "project_name",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {**_ok({"$ref": ref + "EventGroupList"}), **_errors()},
                }
            },
            "/api/bearer/generatetoken": {
                "get": {
                    "summary": "Renew the bearer token; the old token is invalid at once",
                    "operationId": "generateToken",
                    "responses": {**_ok({"$ref": ref + "TokenResponse"}), **_errors()},
                }
            },
            "/api/sellout/all": {
                "get": {
                    "summary": "Token test route",
                    "operationId": "testToken",
                    "responses": {**_ok({"type": "object"}), **_errors()},
                }
            },
            "/api-docs": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": _ok({"type": "object"}),
                }
            },
        },
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                },
                "TransactionList": {
                    "type": "object",
                    "required": ["transactions"],
                    "properties": {
                        "transactions": {"type": "array", "items": {"$ref": ref + "Transaction"}},
                        "count": {"type": "integer"},
                        "debug": {
                            "type": "object",
                            "properties": {"query": {"type": "object"}},
                        },
                    },
                },
                "Transaction": {
                    "type": "object",
                    "properties": {
                        "_id": {"type": "string"},
                        "price": {"type": "number"},
                        "qty": {"type": "number"},
                        "eventId": {"type": "string"},
                        "productId": {"type": "string"},
                        "proxyProductName": {"type": "string"},
                        "saleTime": {"type": "string", "format": "date-time"},
                        "created": {"type": "string", "format": "date-time"},
                        "date": {"type": "string", "format": "date-time"},
                        "invoice_status": {"type": "string"},
                        "invoice_id": {"type": "array", "items": {"type": "string"}},
                        "prev_invoice_id": {"type": "string"},
                        "credits": {"type": "number"},
                        "item_credit_state": {"type": "boolean"},
                        "exportDetails": {
                            "type": "object",
                            "properties": {"processed": {"type": "boolean"}},
                        },
                        "_customReport": {"type": "object"},
                    },
                },
                "Event": {
                    "type": "object",
                    "properties": {
                        "_id": {"type": "string"},
                        "project_id": {"type": "object"},
                        "point_of_sale": {"type": "object"},
                        "pointOfSaleProjectStructure": {"type": "object"},
                        "times": {"type": "array", "items": {"type": "object"}},
                        "eventState": {"type": "string"},
                        "eventStateHistory": {"type": "array", "items": {"type": "object"}},
                        "eventStateTimestamps": {"type": "object"},
                        "eventUser": {"type": "array", "items": {"type": "object"}},
                        "agency_user": {"type": "array", "items": {"type": "object"}},
                        "customReportResult": {"type": "array", "items": {"type": "object"}},
                    },
                },
                "EventGroupList": {
                    "type": "object",
                    "properties": {
                        "total": {"type": "integer"},
                        "data": {"type": "array", "items": {"$ref": ref + "EventGroup"}},
                    },
                },
                "EventGroup": {
                    "type": "object",
                    "properties": {
                        "_id": {"type": "string"},
                        "name": {"type": "string"},
                        "project_name": {"type": "string"},
                        "events": {"type": "array", "items": {"type": "string"}},
                        "created": {"type": "string", "format": "date-time"},
                    },
                },
                "TokenResponse": {
                    "type": "object",
                    "properties": {"token": {"type": "string"}, "user": {"type": "object"}},
                },
            },
        },
    }

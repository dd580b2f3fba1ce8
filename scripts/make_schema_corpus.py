#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/schemas/corpus.jsonl: 300 JSON Schemas (draft 2020-12)
in the style of real-world payloads (API requests and responses, configs, forms, orders with line
items, unions, recursive trees), composed from seeded random choices; none is copied from a
benchmark's files. One line per schema: {"name": ..., "schema": {...}}. Stdlib only.

    python3 scripts/make_schema_corpus.py [--out PATH] [--count 300] [--seed 7]
"""
import argparse
import json
import random
from pathlib import Path

WORDS = ["id", "name", "email", "status", "created_at", "price", "quantity", "sku", "tags",
         "address", "city", "country", "zip", "phone", "title", "description", "enabled",
         "priority", "owner", "count", "score", "version", "region", "currency", "notes",
         "url", "uuid", "date", "time", "level", "kind", "label", "weight", "height", "color"]
FORMATS = ["date", "date-time", "time", "email", "uuid", "uri"]


def leaf(r: random.Random, depth: int):
    kind = r.choice(["string", "string", "integer", "number", "boolean", "enum", "format",
                     "pattern", "const", "nullable"])
    if kind == "string":
        s = {"type": "string"}
        if r.random() < 0.6:
            s["maxLength"] = r.choice([8, 16, 32, 64])
        if r.random() < 0.3:
            s["minLength"] = r.choice([1, 2, 3])
        return s
    if kind == "integer":
        s = {"type": "integer"}
        lo = r.choice([0, 1, -10, None])
        if lo is not None:
            s["minimum"] = lo
        if r.random() < 0.6:
            s["maximum"] = r.choice([9, 100, 1000, 65535])
        if r.random() < 0.2:
            s["multipleOf"] = r.choice([2, 5, 10])
        return s
    if kind == "number":
        s = {"type": "number"}
        if r.random() < 0.5:
            s["minimum" if r.random() < 0.5 else "exclusiveMinimum"] = 0
        if r.random() < 0.5:
            s["maximum" if r.random() < 0.5 else "exclusiveMaximum"] = r.choice([1, 100, 1e6])
        return s
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": r.sample(["new", "paid", "shipped", "cancelled", "open", "closed",
                                  "low", "medium", "high", "red", "green", "blue"], r.randint(2, 5))}
    if kind == "format":
        return {"type": "string", "format": r.choice(FORMATS)}
    if kind == "pattern":
        return {"type": "string", "pattern": r.choice(["^[A-Z]{3}-[0-9]{4}$", "^[a-z0-9_]{3,12}$",
                                                        "^\\+?[0-9]{7,12}$", "^v[0-9]+\\.[0-9]+$"])}
    if kind == "const":
        return {"const": r.choice(["v1", 1, True, "fixed"])}
    return {"type": ["string", "null"], "maxLength": 16}


def node(r: random.Random, depth: int):
    if depth >= 3 or r.random() < 0.55:
        return leaf(r, depth)
    kind = r.choice(["object", "object", "array", "anyOf", "oneOf", "tuple", "allOf"])
    if kind == "object":
        return obj(r, depth + 1)
    if kind == "array":
        a = {"type": "array", "items": node(r, depth + 1)}
        if r.random() < 0.7:
            a["maxItems"] = r.choice([2, 3, 5])
        if r.random() < 0.3:
            a["minItems"] = 1
        return a
    if kind == "tuple":
        return {"type": "array", "prefixItems": [leaf(r, depth) for _ in range(r.randint(2, 3))],
                "items": False}
    if kind == "allOf":
        a, b = obj(r, depth + 1, closed=False), obj(r, depth + 1, closed=False)
        return {"allOf": [a, b]}
    return {kind: [leaf(r, depth), obj(r, depth + 1)]}


def obj(r: random.Random, depth: int, closed=None):
    keys = r.sample(WORDS, r.randint(1, 5))
    props = {k: node(r, depth) for k in keys}
    o = {"type": "object", "properties": props,
         "required": [k for k in keys if r.random() < 0.7]}
    if closed is None:
        closed = r.random() < 0.6
    if closed:
        o["additionalProperties"] = False
    return o


def recursive(r: random.Random):
    name = r.choice(["node", "comment", "category", "menu"])
    child = {"type": "object",
             "properties": {"label": {"type": "string", "maxLength": 12},
                            "children": {"type": "array", "items": {"$ref": f"#/$defs/{name}"},
                                         "maxItems": 2}},
             "required": ["label"], "additionalProperties": False}
    return {"$defs": {name: child}, "$ref": f"#/$defs/{name}"}


def order(r: random.Random):
    item = {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "price": {"type": "number", "minimum": 0}},
        "required": ["sku", "quantity", "price"], "additionalProperties": False}
    return {"type": "object", "properties": {
        "order_id": {"type": "string", "format": "uuid"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24}, "email": {"type": "string", "format": "email"}},
            "required": ["name", "email"], "additionalProperties": False},
        "items": {"type": "array", "items": item, "minItems": 1, "maxItems": r.choice([2, 3])},
        "status": {"enum": ["new", "paid", "shipped"]},
        "placed": {"type": "string", "format": "date-time"}},
        "required": ["order_id", "customer", "items", "status"], "additionalProperties": False}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "crates/inference/tests/fixtures/schemas/corpus.jsonl")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    r = random.Random(a.seed)
    lines = []
    for i in range(a.count):
        pick = i % 10
        if pick == 0:
            name, s = f"tree_{i}", recursive(r)
        elif pick == 1:
            name, s = f"order_{i}", order(r)
        else:
            name, s = f"payload_{i}", obj(r, 0)
        s = {"$schema": "https://json-schema.org/draft/2020-12/schema", **s}
        lines.append(json.dumps({"name": name, "schema": s}, sort_keys=True))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} schemas to {a.out} ({a.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

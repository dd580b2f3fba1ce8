//! The DFA engine's translation of a JSON Schema into one regular expression over the bytes of
//! its compact JSON text (`", "` between items, `": "` after keys, no other whitespace,
//! properties in declared order): keywords checked against the supported subset (see the
//! engine's documentation in `dfa/mod.rs`), `allOf` merged, `$ref` inlined (recursion cut at
//! [`MAX_REF_DEPTH`]), `oneOf` checked for disjoint branches, objects, arrays, `enum` / `const`
//! literals, and the scalars of `scalar.rs`. Errors name the feature and its JSON path.

use regex_syntax::hir::Hir;
use serde_json::{Map, Value};

use super::automaton::Table;
use super::scalar::{alt, cat, get_u32, integer, lit, number, opt, parse, rep, string, Re};
use crate::{Error, Result};

/// How many times one `$ref` may be expanded inside itself on a path; a recursive schema's
/// branch that would need more (a deeper tree) is cut off (an optional property is then
/// skipped, an array stays shorter).
pub const MAX_REF_DEPTH: usize = 3;

/// Keywords that never change what is valid.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "title",
    "description",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "x-guidance",
];

/// Keywords the translation understands (besides [`ANNOTATIONS`]).
const KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
];

const OBJECT_KEYS: &[&str] = &["properties", "required", "additionalProperties"];
const ARRAY_KEYS: &[&str] = &["items", "prefixItems", "minItems", "maxItems"];
const STRING_KEYS: &[&str] = &["minLength", "maxLength", "pattern", "format"];
const NUMBER_KEYS: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// The error of a feature outside the supported subset, at JSON path `path`.
pub(super) fn unsupported(feature: impl std::fmt::Display, path: &str) -> Error {
    Error::InvalidInput(format!(
        "JSON schema: {feature} is not supported by the DFA engine (at {path})"
    ))
}

/// The error of a schema that is not valid (or has no valid value), at JSON path `path`.
pub(super) fn invalid(what: impl std::fmt::Display, path: &str) -> Error {
    Error::InvalidInput(format!("invalid JSON schema: {what} (at {path})"))
}

/// A JSON value written compactly with the separators of the generated layout.
fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(x, out);
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// A JSON pointer step (`~` and `/` escaped).
fn step(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

// ---------------------------------------------------------------------------------------------
// Schemas

const T_NULL: u8 = 1;
const T_BOOL: u8 = 2;
const T_OBJECT: u8 = 4;
const T_ARRAY: u8 = 8;
const T_STRING: u8 = 16;
const T_NUMBER: u8 = 32;

fn type_bit(t: &str) -> u8 {
    match t {
        "null" => T_NULL,
        "boolean" => T_BOOL,
        "object" => T_OBJECT,
        "array" => T_ARRAY,
        "string" => T_STRING,
        "number" | "integer" => T_NUMBER,
        _ => 0,
    }
}

fn value_type(v: &Value) -> u8 {
    match v {
        Value::Null => T_NULL,
        Value::Bool(_) => T_BOOL,
        Value::Object(_) => T_OBJECT,
        Value::Array(_) => T_ARRAY,
        Value::String(_) => T_STRING,
        Value::Number(_) => T_NUMBER,
    }
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        _ => value_type(v) == type_bit(t),
    }
}

/// The types a schema names or implies by its keywords.
fn types_of(o: &Map<String, Value>, path: &str) -> Result<Vec<String>> {
    match o.get("type") {
        Some(Value::String(t)) => Ok(vec![t.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid("`type` entries must be strings", path))
            })
            .collect(),
        Some(_) => Err(invalid("`type` must be a string or a list", path)),
        None => {
            let mut out = Vec::new();
            for (keys, t) in [
                (OBJECT_KEYS, "object"),
                (ARRAY_KEYS, "array"),
                (STRING_KEYS, "string"),
                (NUMBER_KEYS, "number"),
            ] {
                if keys.iter().any(|k| o.contains_key(*k)) {
                    out.push(t.to_owned());
                }
            }
            if out.is_empty() {
                return Err(unsupported("an unconstrained value (no `type`)", path));
            }
            Ok(out)
        }
    }
}

/// `allOf` semantics for two schemas of objects and bounds: one schema that both describe.
/// `Value::Bool(false)` when they contradict.
fn merge(a: &Value, b: &Value, path: &str) -> Result<Value> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return match (a, b) {
            (Value::Bool(true), x) | (x, Value::Bool(true)) => Ok(x.clone()),
            (Value::Bool(false), _) | (_, Value::Bool(false)) => Ok(Value::Bool(false)),
            _ => Err(invalid("subschemas must be objects or booleans", path)),
        };
    };
    let mut out = a.clone();
    for (k, vb) in b {
        if ANNOTATIONS.contains(&k.as_str()) {
            continue;
        }
        let Some(va) = out.get(k).cloned() else {
            out.insert(k.clone(), vb.clone());
            continue;
        };
        if &va == vb {
            continue;
        }
        let merged = match k.as_str() {
            "type" => {
                let ta = types_of(a, path)?;
                let tb = types_of(b, path)?;
                let mut t = Vec::new();
                for x in &ta {
                    for y in &tb {
                        let m = match (x.as_str(), y.as_str()) {
                            (x, y) if x == y => x,
                            ("number", "integer") | ("integer", "number") => "integer",
                            _ => continue,
                        };
                        if !t.iter().any(|s: &Value| s == m) {
                            t.push(Value::from(m));
                        }
                    }
                }
                if t.is_empty() {
                    return Ok(Value::Bool(false));
                }
                Value::Array(t)
            }
            "properties" => {
                let (Some(pa), Some(pb)) = (va.as_object(), vb.as_object()) else {
                    return Err(invalid("`properties` must be an object", path));
                };
                let mut p = pa.clone();
                for (name, sb) in pb {
                    let s = match p.get(name) {
                        Some(sa) if sa != sb => serde_json::json!({"allOf": [sa, sb]}),
                        _ => sb.clone(),
                    };
                    p.insert(name.clone(), s);
                }
                Value::Object(p)
            }
            "required" => {
                let mut r = va.as_array().cloned().unwrap_or_default();
                for x in vb.as_array().into_iter().flatten() {
                    if !r.contains(x) {
                        r.push(x.clone());
                    }
                }
                Value::Array(r)
            }
            "minLength" | "minItems" | "minimum" | "exclusiveMinimum" => {
                if va.as_f64() >= vb.as_f64() {
                    va
                } else {
                    vb.clone()
                }
            }
            "maxLength" | "maxItems" | "maximum" | "exclusiveMaximum" => {
                if va.as_f64() <= vb.as_f64() {
                    va
                } else {
                    vb.clone()
                }
            }
            "items" => serde_json::json!({"allOf": [va, vb]}),
            "additionalProperties" | "unevaluatedProperties" => {
                if va == Value::Bool(false) || vb == &Value::Bool(false) {
                    Value::Bool(false)
                } else {
                    va
                }
            }
            "enum" => Value::Array(
                va.as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| vb.as_array().is_some_and(|e| e.contains(x)))
                    .cloned()
                    .collect(),
            ),
            _ => {
                return Err(unsupported(
                    format!("`allOf` with two different `{k}`"),
                    path,
                ))
            }
        };
        out.insert(k.clone(), merged);
    }
    // A closed subschema forbids the properties it does not declare.
    for side in [a, b] {
        if side.get("additionalProperties") == Some(&Value::Bool(false)) {
            let declared = side.get("properties").and_then(Value::as_object);
            let keep = |name: &str| declared.is_some_and(|d| d.contains_key(name));
            if let Some(Value::Object(p)) = out.get_mut("properties") {
                p.retain(|name, _| keep(name));
            }
            let required = out.get("required").and_then(Value::as_array);
            if required.is_some_and(|r| r.iter().any(|n| !n.as_str().is_some_and(keep))) {
                return Ok(Value::Bool(false));
            }
        }
    }
    Ok(Value::Object(out))
}

/// What a oneOf branch can be, to check that the branches are disjoint.
enum Shape {
    Literals(Vec<Value>),
    Types(u8),
}

struct Translator<'a> {
    root: &'a Value,
    refs: Vec<String>,
}

impl<'a> Translator<'a> {
    fn resolve(&self, r: &str, path: &str) -> Result<&'a Value> {
        let pointer = r
            .strip_prefix('#')
            .ok_or_else(|| unsupported(format!("the non-local reference {r:?}"), path))?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| invalid(format!("the reference {r:?} points nowhere"), path))
    }

    fn schema(&mut self, s: &Value, path: &str) -> Result<Re> {
        let o = match s {
            Value::Bool(false) => return Ok(None),
            Value::Bool(true) => return Err(unsupported("an unconstrained value (`true`)", path)),
            Value::Object(o) => o,
            _ => return Err(invalid("a schema must be an object or a boolean", path)),
        };
        for k in o.keys() {
            if !KEYWORDS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return Err(unsupported(format!("the keyword `{k}`"), path));
            }
        }
        let without = |keys: &[&str]| -> Map<String, Value> {
            o.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        if let Some(all) = o.get("allOf") {
            let list = all
                .as_array()
                .ok_or_else(|| invalid("`allOf` must be a list", path))?;
            let mut merged = Value::Object(without(&["allOf"]));
            for (i, sub) in list.iter().enumerate() {
                merged = merge(&merged, sub, &format!("{path}/allOf/{i}"))?;
            }
            return self.schema(&merged, path);
        }
        if let Some(r) = o.get("$ref") {
            let r = r
                .as_str()
                .ok_or_else(|| invalid("`$ref` must be a string", path))?;
            let target = self.resolve(r, path)?;
            if self.refs.iter().filter(|x| *x == r).count() >= MAX_REF_DEPTH {
                return Ok(None);
            }
            let siblings = without(&["$ref"]);
            let body = if siblings.is_empty() {
                target.clone()
            } else {
                merge(target, &Value::Object(siblings), path)?
            };
            self.refs.push(r.to_owned());
            let re = self.schema(&body, r);
            self.refs.pop();
            return re;
        }
        let any_of = o.get("anyOf").map(|v| ("anyOf", v));
        if let Some((key, list)) = any_of.or(o.get("oneOf").map(|v| ("oneOf", v))) {
            if o.contains_key("anyOf") && o.contains_key("oneOf") {
                return Err(unsupported("`anyOf` together with `oneOf`", path));
            }
            let list = list
                .as_array()
                .ok_or_else(|| invalid(format!("`{key}` must be a list"), path))?;
            let siblings = Value::Object(without(&[key]));
            let mut branches = Vec::new();
            for (i, b) in list.iter().enumerate() {
                let bpath = format!("{path}/{key}/{i}");
                let b = if siblings.as_object().is_some_and(Map::is_empty) {
                    b.clone()
                } else {
                    merge(&siblings, b, &bpath)?
                };
                branches.push((self.schema(&b, &bpath)?, b));
            }
            if key == "oneOf" {
                let live: Vec<&Value> = branches
                    .iter()
                    .filter(|(re, _)| re.is_some())
                    .map(|(_, b)| b)
                    .collect();
                let shapes: Vec<Shape> = live.iter().map(|b| self.shape(b, 0)).collect();
                for (i, a) in shapes.iter().enumerate() {
                    for b in &shapes[i + 1..] {
                        if overlap(a, b) {
                            return Err(unsupported(
                                "`oneOf` with branches that may overlap",
                                path,
                            ));
                        }
                    }
                }
            }
            return Ok(alt(branches.into_iter().map(|(re, _)| re).collect()));
        }
        if o.contains_key("enum") || o.contains_key("const") {
            return self.literals(o, path);
        }
        let mut parts = Vec::new();
        for t in types_of(o, path)? {
            parts.push(match t.as_str() {
                "object" => self.object(o, path)?,
                "array" => self.array(o, path)?,
                "string" => string(o, path)?,
                "integer" => integer(o, path)?,
                "number" => number(o, path)?,
                "boolean" => Some(parse("true|false")),
                "null" => Some(lit("null")),
                _ => return Err(invalid(format!("unknown type {t:?}"), path)),
            });
        }
        Ok(alt(parts))
    }

    /// What values a schema can take, roughly (for oneOf disjointness; conservative).
    fn shape(&self, s: &Value, depth: usize) -> Shape {
        let Some(o) = s.as_object() else {
            return Shape::Types(if s == &Value::Bool(false) { 0 } else { 0xff });
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return match self.resolve(r, "") {
                Ok(t) if depth < 8 && o.len() == 1 => self.shape(t, depth + 1),
                _ => Shape::Types(0xff),
            };
        }
        if o.contains_key("allOf") || o.contains_key("not") {
            return Shape::Types(0xff);
        }
        if let Some(list) = o.get("anyOf").or(o.get("oneOf")).and_then(Value::as_array) {
            let mask = list.iter().fold(0, |m, b| {
                m | match self.shape(b, depth + 1) {
                    Shape::Types(t) => t,
                    Shape::Literals(v) => v.iter().fold(0, |m, x| m | value_type(x)),
                }
            });
            return Shape::Types(mask);
        }
        if let Some(c) = o.get("const") {
            return Shape::Literals(vec![c.clone()]);
        }
        if let Some(e) = o.get("enum").and_then(Value::as_array) {
            return Shape::Literals(e.clone());
        }
        match types_of(o, "") {
            Ok(ts) => Shape::Types(ts.iter().fold(0, |m, t| m | type_bit(t))),
            Err(_) => Shape::Types(0xff),
        }
    }

    fn literals(&mut self, o: &Map<String, Value>, path: &str) -> Result<Re> {
        let mut values: Vec<Value> = match o.get("enum") {
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(invalid("`enum` must be a list", path)),
            None => Vec::new(),
        };
        if let Some(c) = o.get("const") {
            if o.contains_key("enum") {
                values.retain(|v| v == c);
            } else {
                values.push(c.clone());
            }
        }
        if o.contains_key("type") {
            let types = types_of(o, path)?;
            values.retain(|v| types.iter().any(|t| is_type(v, t)));
        }
        // Other keywords beside the literals: keep the literals that the rest of the schema,
        // restricted to the literal's own type, accepts as written.
        let rest: Map<String, Value> = o
            .iter()
            .filter(|(k, _)| !["enum", "const", "type"].contains(&k.as_str()))
            .filter(|(k, _)| !ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out = Vec::new();
        for v in values {
            let mut text = String::new();
            write_json(&v, &mut text);
            if !rest.is_empty() {
                let mut sub = rest.clone();
                let t = match &v {
                    Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                    Value::Number(_) => "number",
                    Value::Null => "null",
                    Value::Bool(_) => "boolean",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                };
                sub.insert("type".into(), Value::from(t));
                let Some(h) = self.schema(&Value::Object(sub), path)? else {
                    continue;
                };
                if !Table::build(&h)?.matches(text.as_bytes()) {
                    continue;
                }
            }
            out.push(Some(lit(&text)));
        }
        Ok(alt(out))
    }

    fn object(&mut self, o: &Map<String, Value>, path: &str) -> Result<Re> {
        let empty = Map::new();
        let props = match o.get("properties") {
            Some(Value::Object(p)) => p,
            Some(_) => return Err(invalid("`properties` must be an object", path)),
            None => &empty,
        };
        let required: Vec<&str> = match o.get("required") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(invalid("`required` must be a list", path)),
            None => Vec::new(),
        };
        for r in &required {
            if !props.contains_key(*r) {
                return Err(unsupported(
                    format!("the required property `{r}` without a schema in `properties`"),
                    path,
                ));
            }
        }
        // (required, `"key": value`) in declared order; optional unsatisfiable ones dropped.
        let mut items: Vec<(bool, Hir)> = Vec::new();
        for (k, v) in props {
            let req = required.contains(&k.as_str());
            let value = self.schema(v, &step(&format!("{path}/properties"), k))?;
            let key = format!("{}: ", Value::String(k.clone()));
            match (value, req) {
                (Some(value), _) => items.push((req, Hir::concat(vec![lit(&key), value]))),
                (None, true) => return Ok(None),
                (None, false) => {}
            }
        }
        let sep = || Some(lit(", "));
        let tail = |from: usize| -> Vec<Re> {
            items[from..]
                .iter()
                .map(|(req, p)| {
                    let x = cat(vec![sep(), Some(p.clone())]);
                    if *req {
                        x
                    } else {
                        opt(x)
                    }
                })
                .collect()
        };
        let body = match items.iter().position(|(req, _)| *req) {
            Some(first) => {
                let mut parts: Vec<Re> = items[..first]
                    .iter()
                    .map(|(_, p)| opt(cat(vec![Some(p.clone()), sep()])))
                    .collect();
                parts.push(Some(items[first].1.clone()));
                parts.extend(tail(first + 1));
                cat(parts)
            }
            None => opt(alt((0..items.len())
                .map(|i| {
                    let mut parts = vec![Some(items[i].1.clone())];
                    parts.extend(tail(i + 1));
                    cat(parts)
                })
                .collect())),
        };
        Ok(cat(vec![Some(lit("{")), body, Some(lit("}"))]))
    }

    fn array(&mut self, o: &Map<String, Value>, path: &str) -> Result<Re> {
        let min = get_u32(o, "minItems", path)?.unwrap_or(0);
        let max = get_u32(o, "maxItems", path)?;
        let mut prefix = Vec::new();
        if let Some(p) = o.get("prefixItems") {
            let p = p
                .as_array()
                .ok_or_else(|| invalid("`prefixItems` must be a list", path))?;
            for (i, s) in p.iter().enumerate() {
                prefix.push(self.schema(s, &format!("{path}/prefixItems/{i}"))?);
            }
        }
        // Items after the prefix: none without `items` (a strict subset when absent).
        let item = match o.get("items") {
            None | Some(Value::Bool(false)) => None,
            Some(s) => self.schema(s, &format!("{path}/items"))?,
        };
        let n = prefix.len() as u32;
        let sep = |k: u32| Some(if k == 0 { Hir::empty() } else { lit(", ") });
        // Items from position n on, given n items before.
        let rest_min = min.saturating_sub(n);
        let rest_max = max.map(|m| m.saturating_sub(n));
        let mut rest: Re = if rest_max == Some(0) || item.is_none() {
            (rest_min == 0).then(Hir::empty)
        } else if n == 0 {
            let more = rep(
                cat(vec![sep(1), item.clone()]),
                rest_min.saturating_sub(1),
                rest_max.map(|m| m - 1),
            );
            let some = cat(vec![item.clone(), more]);
            if rest_min == 0 {
                opt(some)
            } else {
                some
            }
        } else {
            rep(cat(vec![sep(1), item.clone()]), rest_min, rest_max)
        };
        // The prefix from the back: item k present only if the ones before it are.
        for k in (0..n).rev() {
            let here = if max.is_some_and(|m| k >= m) {
                Some(Hir::empty())
            } else {
                cat(vec![sep(k), prefix[k as usize].clone(), rest])
            };
            rest = if k >= min { opt(here) } else { here };
        }
        Ok(cat(vec![Some(lit("[")), rest, Some(lit("]"))]))
    }
}

fn overlap(a: &Shape, b: &Shape) -> bool {
    match (a, b) {
        (Shape::Literals(x), Shape::Literals(y)) => x.iter().any(|v| y.contains(v)),
        (Shape::Literals(x), Shape::Types(t)) | (Shape::Types(t), Shape::Literals(x)) => {
            x.iter().any(|v| value_type(v) & t != 0)
        }
        (Shape::Types(s), Shape::Types(t)) => s & t != 0,
    }
}

/// The regular expression (in `regex-syntax` syntax) of the compact JSON texts valid under
/// `schema`, or an error naming the first unsupported feature and its JSON path.
pub fn schema_regex(schema: &Value) -> Result<String> {
    translate(schema).map(|h| h.to_string())
}

/// The regular expression of `schema` (see [`schema_regex`]).
pub(super) fn translate(schema: &Value) -> Result<Hir> {
    let mut t = Translator {
        root: schema,
        refs: Vec::new(),
    };
    t.schema(schema, "#")?.ok_or_else(|| {
        invalid(
            "no value is valid (or recursion deeper than the limit)",
            "#",
        )
    })
}

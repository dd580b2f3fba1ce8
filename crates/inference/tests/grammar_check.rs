//! The check of a constrained output against its JSON Schema that the grammar tests share
//! (grammar_corpus.rs and grammar_dfa.rs include this file as a module, `#[path]`): the output
//! must be JSON and valid under the schema (the `jsonschema` crate, `format`s too when asked:
//! the DFA engine's formats are strict subsets; llguidance's are looser than the validator's,
//! e.g. a leap second at any minute, "22:33:60.63Z"), except
//! that JSON with numbers past f64 is only checked to be JSON, since the validator reads
//! numbers as f64 (an exponent past its range does not parse, an integer past 2^53 compares
//! inexactly: a `multipleOf` of a 50-digit integer). Built alone, this file tests the check.

use serde_json::Value;

/// What [`check`] could say of an output.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// JSON and valid under the schema.
    Valid,
    /// JSON, with a number past f64: not validated.
    BeyondF64,
}

/// Checks `text`, a completed output under `schema` (named `name` in messages; `formats`:
/// whether `format`s are validated too): panics when it is not JSON or is invalid.
pub fn check(name: &str, schema: &Value, text: &str, formats: bool) -> Checked {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) if e.to_string().contains("number out of range") => {
            serde_json::from_str::<serde::de::IgnoredAny>(text)
                .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {text:?}"));
            return Checked::BeyondF64;
        }
        Err(e) => panic!("{name}: not JSON ({e}): {text:?}"),
    };
    if inexact(&value) {
        return Checked::BeyondF64;
    }
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(formats)
        .build(schema)
        .unwrap_or_else(|e| panic!("{name}: the validator refuses the schema: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:?}: {text}");
    Checked::Valid
}

/// Whether a value holds a number past 2^53 (an integer there is not exact as f64).
fn inexact(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_f64().is_some_and(|x| x.abs() > (1u64 << 53) as f64),
        Value::Array(a) => a.iter().any(inexact),
        Value::Object(o) => o.values().any(inexact),
        _ => false,
    }
}

#[test]
fn numbers_past_f64_are_not_validated() {
    let schema = serde_json::json!({"type": "integer", "multipleOf": 5});
    assert_eq!(check("small", &schema, "-75", true), Checked::Valid);
    let big = "-73333333333333333333333334444444444454454547461130";
    assert_eq!(check("big", &schema, big, true), Checked::BeyondF64);
    assert_eq!(check("exp", &schema, "1e999", true), Checked::BeyondF64);
    let time = serde_json::json!({"type": "string", "format": "time"});
    assert_eq!(check("leap", &time, "\"22:33:60Z\"", false), Checked::Valid);
}

#[test]
#[should_panic(expected = "not a multiple of 5")]
fn invalid_outputs_fail_the_check() {
    check("bad", &serde_json::json!({"multipleOf": 5}), "7", false);
}

#[test]
#[should_panic(expected = "is not a")]
fn formats_are_validated_when_asked() {
    let time = serde_json::json!({"type": "string", "format": "time"});
    check("leap", &time, "\"22:33:60Z\"", true);
}

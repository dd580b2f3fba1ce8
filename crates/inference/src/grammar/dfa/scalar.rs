//! The regular expressions of JSON scalars as the DFA engine writes them: the building blocks
//! of expressions (concatenation, alternation and repetition of possibly unsatisfiable parts),
//! JSON string characters, integer ranges as digit runs (exact bounds and `multipleOf` by the
//! last digit), decimal numbers within integral bounds, string `format`s and `pattern`s
//! restricted to what a JSON string holds, and the `string` / `integer` / `number` schemas
//! built from them (the translator of whole schemas is in `schema.rs`).

use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Repetition};
use serde_json::{Map, Value};

use super::schema::{invalid, unsupported};
use crate::Result;

/// A regular expression, or `None` for one that matches nothing (an unsatisfiable branch).
pub(super) type Re = Option<Hir>;

/// The literal text `s`.
pub(super) fn lit(s: &str) -> Hir {
    Hir::literal(s.as_bytes())
}

/// The concatenation of `parts` (unsatisfiable if any part is).
pub(super) fn cat(parts: Vec<Re>) -> Re {
    parts
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .map(Hir::concat)
}

/// The alternation of the satisfiable `parts` (unsatisfiable if none is).
pub(super) fn alt(parts: Vec<Re>) -> Re {
    let v: Vec<Hir> = parts.into_iter().flatten().collect();
    (!v.is_empty()).then(|| Hir::alternation(v))
}

/// `h` from `min` to `max` times (greedy; `max` `None`: unbounded).
pub(super) fn rep(h: Re, min: u32, max: Option<u32>) -> Re {
    match h {
        None => (min == 0).then(Hir::empty),
        Some(_) if max == Some(0) => Some(Hir::empty()),
        Some(h) => Some(Hir::repetition(Repetition {
            min,
            max,
            greedy: true,
            sub: Box::new(h),
        })),
    }
}

/// `h` or nothing.
pub(super) fn opt(h: Re) -> Re {
    rep(h, 0, Some(1))
}

/// An internal regular expression (always valid).
pub(super) fn parse(re: &str) -> Hir {
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(re)
        .expect("internal regular expression")
}

/// Characters a JSON string holds without an escape.
pub(super) fn safe_chars() -> ClassUnicode {
    ClassUnicode::new([
        ClassUnicodeRange::new('\u{20}', '\u{21}'),
        ClassUnicodeRange::new('\u{23}', '\u{5b}'),
        ClassUnicodeRange::new('\u{5d}', '\u{10ffff}'),
    ])
}

/// One character of a JSON string: unescaped, a short escape, or `\u` of a non-surrogate.
pub(super) fn json_char() -> Hir {
    Hir::alternation(vec![
        Hir::class(Class::Unicode(safe_chars())),
        parse(r#"\\["\\/bfnrt]|\\u(?:[0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"#),
    ])
}

// ---------------------------------------------------------------------------------------------
// Numbers

/// A run of decimal digits: the digits allowed at each position (bit d for digit d); `open`
/// allows any number of further digits after the first position.
struct Digits {
    sets: Vec<u16>,
    open: bool,
}

const ALL_DIGITS: u16 = 0x3ff;

fn digit_range(a: u8, b: u8) -> u16 {
    (a..=b).fold(0, |m, d| m | 1 << d)
}

/// Digit strings of one length from `lo` to `hi` (as ASCII digits, `lo <= hi`).
fn same_len(lo: &[u8], hi: &[u8]) -> Vec<Vec<u16>> {
    let Some((&l0, lr)) = lo.split_first() else {
        return vec![Vec::new()];
    };
    let (h0, hr) = (hi[0], &hi[1..]);
    let (l0, h0) = (l0 - b'0', h0 - b'0');
    let prefixed = |d: u8, rest: Vec<Vec<u16>>| {
        rest.into_iter()
            .map(|mut s| {
                s.insert(0, 1 << d);
                s
            })
            .collect::<Vec<_>>()
    };
    if l0 == h0 {
        return prefixed(l0, same_len(lr, hr));
    }
    let (lo_zeros, hi_nines) = (lr.iter().all(|&c| c == b'0'), hr.iter().all(|&c| c == b'9'));
    let mut out = Vec::new();
    let (mut first, mut last) = (l0, h0);
    if !lo_zeros {
        out.extend(prefixed(l0, same_len(lr, &vec![b'9'; lr.len()])));
        first += 1;
    }
    if !hi_nines {
        last -= 1;
    }
    if first <= last {
        let mut s = vec![digit_range(first, last)];
        s.extend(std::iter::repeat_n(ALL_DIGITS, lr.len()));
        out.push(s);
    }
    if !hi_nines {
        out.extend(prefixed(h0, same_len(&vec![b'0'; hr.len()], hr)));
    }
    out
}

/// Decimal integers from `lo` to `hi` (unbounded above when `None`), without leading zeros.
fn nonneg_range(lo: u64, hi: Option<u64>) -> Vec<Digits> {
    let len = |x: u64| x.to_string().len();
    let fixed = |a: u64, b: u64| -> Vec<Digits> {
        let mut out = Vec::new();
        for d in len(a)..=len(b) {
            let first = if d == 1 { 0 } else { 10u64.pow(d as u32 - 1) };
            let (a, b) = (a.max(first), b.min(10u64.pow(d as u32) - 1));
            if a <= b {
                out.extend(
                    same_len(a.to_string().as_bytes(), b.to_string().as_bytes())
                        .into_iter()
                        .map(|sets| Digits { sets, open: false }),
                );
            }
        }
        out
    };
    match hi {
        Some(hi) if hi < lo => Vec::new(),
        Some(hi) => fixed(lo, hi),
        None => {
            let d = len(lo);
            let mut out = fixed(lo, 10u64.pow(d as u32) - 1);
            let mut sets = vec![digit_range(1, 9)];
            sets.extend(std::iter::repeat_n(ALL_DIGITS, d));
            out.push(Digits { sets, open: true });
            out
        }
    }
}

fn digit_class(set: u16) -> Hir {
    let mut c = ClassUnicode::empty();
    for d in 0..10u8 {
        if set >> d & 1 == 1 {
            let ch = char::from(b'0' + d);
            c.push(ClassUnicodeRange::new(ch, ch));
        }
    }
    Hir::class(Class::Unicode(c))
}

/// The digit runs as a regular expression; `last` restricts the last digit (multipleOf).
fn digits_re(runs: Vec<Digits>, last: u16) -> Re {
    alt(runs
        .into_iter()
        .map(|mut r| {
            if let Some(l) = r.sets.last_mut() {
                *l &= last;
            }
            if r.sets.contains(&0) {
                return None;
            }
            let mut parts: Vec<Hir> = r.sets.iter().map(|&s| digit_class(s)).collect();
            if r.open {
                parts.insert(1, rep(Some(digit_class(ALL_DIGITS)), 0, None).unwrap());
            }
            Some(Hir::concat(parts))
        })
        .collect())
}

/// Integers from `lo` to `hi` (inclusive, either unbounded); `last` as in [`digits_re`].
fn int_re(lo: Option<i64>, hi: Option<i64>, last: u16) -> Re {
    let mut parts = Vec::new();
    if hi.is_none_or(|h| h >= 0) {
        let a = lo.map_or(0, |l| l.max(0)) as u64;
        parts.push(digits_re(nonneg_range(a, hi.map(|h| h as u64)), last));
    }
    if lo.is_none_or(|l| l < 0) {
        let a = hi.map_or(1, |h| (-h).max(1)) as u64;
        let b = lo.map(|l| l.unsigned_abs());
        parts.push(cat(vec![
            Some(lit("-")),
            digits_re(nonneg_range(a, b), last),
        ]));
    }
    alt(parts)
}

/// A bound: the value and whether it is exclusive.
type Bound = (i64, bool);

/// Non-negative decimal numbers (no exponent) within `lo` (>= 0) and `hi`.
fn nonneg_number(lo: Bound, hi: Option<Bound>) -> Re {
    let frac = || opt(Some(parse(r"\.[0-9]+")));
    let i_min = if lo.1 { lo.0 + 1 } else { lo.0 };
    let mut parts = Vec::new();
    // Integer part strictly below the upper bound: any fraction.
    let i_max = hi.map(|(h, _)| h - 1);
    if i_max.is_none_or(|m| m >= i_min) {
        parts.push(cat(vec![
            digits_re(
                nonneg_range(i_min as u64, i_max.map(|m| m as u64)),
                ALL_DIGITS,
            ),
            frac(),
        ]));
    }
    // An exclusive lower bound itself with a non-zero fraction.
    if lo.1 && hi.is_none_or(|(h, _)| h > lo.0) {
        parts.push(Some(Hir::concat(vec![
            lit(&lo.0.to_string()),
            parse(r"\.[0-9]*[1-9][0-9]*"),
        ])));
    }
    // An inclusive upper bound itself, with zeros only after the point.
    if let Some((h, false)) = hi {
        if h >= i_min {
            parts.push(cat(vec![
                Some(lit(&h.to_string())),
                opt(Some(parse(r"\.0+"))),
            ]));
        }
    }
    alt(parts)
}

/// Decimal numbers within integral bounds (either may be absent; no exponent).
fn number_re(lo: Option<Bound>, hi: Option<Bound>) -> Re {
    let mut parts = Vec::new();
    if hi.is_none_or(|(h, ex)| h > 0 || (h == 0 && !ex)) {
        let l = match lo {
            Some((l, ex)) if l >= 0 => (l, ex),
            _ => (0, false),
        };
        parts.push(nonneg_number(l, hi));
    }
    if lo.is_none_or(|(l, _)| l < 0) {
        // v = -w with w > 0.
        let w_lo = match hi {
            Some((h, ex)) if h < 0 => (-h, ex),
            _ => (0, true),
        };
        let w_hi = lo.map(|(l, ex)| (-l, ex));
        parts.push(cat(vec![Some(lit("-")), nonneg_number(w_lo, w_hi)]));
    }
    alt(parts)
}

// ---------------------------------------------------------------------------------------------
// Strings

fn format_re(format: &str) -> Option<Hir> {
    const DATE: &str = "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
    const TIME: &str = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    const LABEL: &str = "[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?";
    Some(parse(&match format {
        "date" => DATE.to_owned(),
        "time" => TIME.to_owned(),
        "date-time" => format!("{DATE}T{TIME}"),
        "uuid" => "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
            .to_owned(),
        "email" => format!(
            "[a-zA-Z0-9_+-]{{1,15}}(?:\\.[a-zA-Z0-9_+-]{{1,15}}){{0,3}}@{LABEL}(?:\\.{LABEL}){{1,3}}"
        ),
        "uri" => format!(
            "https?://{LABEL}(?:\\.{LABEL}){{0,3}}(?:/[a-zA-Z0-9._~-]{{0,32}}){{0,4}}(?:\\?[a-zA-Z0-9._~=&-]{{0,32}})?"
        ),
        _ => return None,
    }))
}

/// ECMA-262 `\d`, `\w` (and negations) are ASCII; `regex-syntax` would read them as Unicode.
fn ecma_classes(p: &str) -> String {
    let mut out = String::new();
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str("[0-9]"),
            Some('D') => out.push_str("[^0-9]"),
            Some('w') => out.push_str("[A-Za-z0-9_]"),
            Some('W') => out.push_str("[^A-Za-z0-9_]"),
            Some(n) => {
                out.push('\\');
                out.push(n);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// A pattern's syntax tree restricted to what a JSON string can hold: literal characters
/// that need escapes are escaped, classes lose the characters that would need them.
fn sanitize(h: Hir, path: &str) -> Result<Re> {
    Ok(match h.into_kind() {
        HirKind::Empty => Some(Hir::empty()),
        HirKind::Literal(l) => {
            let s = std::str::from_utf8(&l.0).map_err(|_| invalid("non-UTF-8 pattern", path))?;
            let quoted = Value::String(s.to_owned()).to_string();
            Some(lit(&quoted[1..quoted.len() - 1]))
        }
        HirKind::Class(Class::Unicode(mut c)) => {
            c.intersect(&safe_chars());
            (!c.ranges().is_empty()).then(|| Hir::class(Class::Unicode(c)))
        }
        HirKind::Class(Class::Bytes(_)) => {
            return Err(unsupported("a byte class in `pattern`", path))
        }
        HirKind::Look(_) => {
            return Err(unsupported(
                "an anchor or word boundary inside `pattern`",
                path,
            ))
        }
        HirKind::Repetition(r) => rep(sanitize(*r.sub, path)?, r.min, r.max),
        HirKind::Capture(c) => sanitize(*c.sub, path)?,
        HirKind::Concat(v) => cat(v
            .into_iter()
            .map(|h| sanitize(h, path))
            .collect::<Result<_>>()?),
        HirKind::Alternation(v) => alt(v
            .into_iter()
            .map(|h| sanitize(h, path))
            .collect::<Result<_>>()?),
    })
}

fn pattern_re(p: &str, path: &str) -> Result<Re> {
    let start = p.starts_with('^');
    let body = if start { &p[1..] } else { p };
    let trailing_bs = body[..body.len().saturating_sub(1)]
        .chars()
        .rev()
        .take_while(|&c| c == '\\')
        .count();
    let end = body.ends_with('$') && trailing_bs % 2 == 0;
    let body = if end { &body[..body.len() - 1] } else { body };
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(&ecma_classes(body))
        .map_err(|e| invalid(format!("pattern {p:?}: {e}"), path))?;
    let any = || rep(Some(json_char()), 0, None);
    Ok(cat(vec![
        if start { Some(Hir::empty()) } else { any() },
        sanitize(hir, path)?,
        if end { Some(Hir::empty()) } else { any() },
    ]))
}

/// The small non-negative integer at `key`, if present.
pub(super) fn get_u32(o: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u32>> {
    o.get(key)
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    invalid(
                        format!("`{key}` must be a small non-negative integer"),
                        path,
                    )
                })
        })
        .transpose()
}

fn get_f64(o: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>> {
    o.get(key)
        .map(|v| {
            v.as_f64()
                .filter(|x| x.abs() < 1e15)
                .ok_or_else(|| unsupported(format!("`{key}` {v}"), path))
        })
        .transpose()
}

/// A `string` schema: quoted JSON characters within `minLength` / `maxLength`, or its
/// `format` or `pattern` (length bounds beside them only where they hold statically).
pub(super) fn string(o: &Map<String, Value>, path: &str) -> Result<Re> {
    let min = get_u32(o, "minLength", path)?.unwrap_or(0);
    let max = get_u32(o, "maxLength", path)?;
    let quoted = |h: Re| cat(vec![Some(lit("\"")), h, Some(lit("\""))]);
    let fixed = match (o.get("format"), o.get("pattern")) {
        (Some(_), Some(_)) => {
            return Err(unsupported("`format` together with `pattern`", path));
        }
        (Some(f), None) => {
            let f = f
                .as_str()
                .ok_or_else(|| invalid("`format` must be a string", path))?;
            let h = format_re(f).ok_or_else(|| unsupported(format!("the format {f:?}"), path))?;
            Some((Some(h), format!("`format` {f:?}")))
        }
        (None, Some(p)) => {
            let p = p
                .as_str()
                .ok_or_else(|| invalid("`pattern` must be a string", path))?;
            Some((pattern_re(p, path)?, "`pattern`".to_owned()))
        }
        (None, None) => None,
    };
    let Some((h, what)) = fixed else {
        return Ok(quoted(rep(Some(json_char()), min, max)));
    };
    if min > 0 || max.is_some() {
        // Length bounds are checked, not intersected: an ASCII expression's bytes are its
        // characters, and its lengths must lie within the bounds.
        let ok = h.as_ref().is_none_or(|h| {
            let p = h.properties();
            let ascii = p.is_utf8() && ascii_only(h);
            ascii
                && p.minimum_len().is_some_and(|l| l >= min as usize)
                && max.is_none_or(|m| p.maximum_len().is_some_and(|l| l <= m as usize))
        });
        if !ok {
            return Err(unsupported(
                format!("{what} together with length bounds"),
                path,
            ));
        }
    }
    Ok(quoted(h))
}

/// Whether every character an expression can match is ASCII and needs no JSON escape.
fn ascii_only(h: &Hir) -> bool {
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => true,
        HirKind::Literal(l) => l.0.iter().all(|&b| b.is_ascii() && b != b'\\'),
        HirKind::Class(Class::Unicode(c)) => c.is_ascii(),
        HirKind::Class(Class::Bytes(c)) => c.is_ascii(),
        HirKind::Repetition(r) => ascii_only(&r.sub),
        HirKind::Capture(c) => ascii_only(&c.sub),
        HirKind::Concat(v) | HirKind::Alternation(v) => v.iter().all(ascii_only),
    }
}

/// Lower and upper bounds of a number, each `(value, exclusive)`.
type Bounds = (Option<(f64, bool)>, Option<(f64, bool)>);

/// Lower and upper bounds of a number schema (`(value, exclusive)`).
fn bounds(o: &Map<String, Value>, path: &str) -> Result<Bounds> {
    let pick = |a: Option<f64>, ea: Option<f64>, lower: bool| -> Option<(f64, bool)> {
        match (a, ea) {
            (Some(a), Some(e)) if (lower && e >= a) || (!lower && e <= a) => Some((e, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(e)) => Some((e, true)),
            (None, None) => None,
        }
    };
    let lo = pick(
        get_f64(o, "minimum", path)?,
        get_f64(o, "exclusiveMinimum", path)?,
        true,
    );
    let hi = pick(
        get_f64(o, "maximum", path)?,
        get_f64(o, "exclusiveMaximum", path)?,
        false,
    );
    Ok((lo, hi))
}

/// An `integer` schema: its bounds (exclusive ones made inclusive) and `multipleOf`.
pub(super) fn integer(o: &Map<String, Value>, path: &str) -> Result<Re> {
    let (lo, hi) = bounds(o, path)?;
    let lo = lo.map(|(v, ex)| {
        if ex {
            v.floor() as i64 + 1
        } else {
            v.ceil() as i64
        }
    });
    let hi = hi.map(|(v, ex)| {
        if ex {
            v.ceil() as i64 - 1
        } else {
            v.floor() as i64
        }
    });
    let last = match get_f64(o, "multipleOf", path)? {
        None => ALL_DIGITS,
        Some(1.0) => ALL_DIGITS,
        Some(2.0) => 0b01_0101_0101,
        Some(5.0) => 0b00_0010_0001,
        Some(10.0) => 1,
        Some(k) => return Err(unsupported(format!("`multipleOf` {k}"), path)),
    };
    Ok(int_re(lo, hi, last))
}

/// A `number` schema: any JSON number, or a decimal (no exponent) within integral bounds.
pub(super) fn number(o: &Map<String, Value>, path: &str) -> Result<Re> {
    if o.contains_key("multipleOf") {
        return Err(unsupported("`multipleOf` on a number", path));
    }
    let (lo, hi) = bounds(o, path)?;
    if lo.is_none() && hi.is_none() {
        return Ok(Some(parse(
            r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
        )));
    }
    let integral = |b: Option<(f64, bool)>| -> Result<Option<Bound>> {
        b.map(|(v, ex)| {
            if v.fract() == 0.0 {
                Ok((v as i64, ex))
            } else {
                Err(unsupported(
                    format!("the non-integral number bound {v}"),
                    path,
                ))
            }
        })
        .transpose()
    };
    Ok(number_re(integral(lo)?, integral(hi)?))
}

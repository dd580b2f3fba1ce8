//! Python formatting that chat templates observe: `json.dumps` (the `tojson` filter that
//! transformers installs), `repr(float)`, and `datetime.strftime` (the `strftime_now` global).
//!
//! Owns only text formatting of template values; the template environment is in [`super`].

use std::fmt::Write;

/// Options of Python's `json.dumps` that transformers' `tojson` filter exposes.
#[derive(Clone, Debug, Default)]
pub struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX` (transformers' default is `false`).
    pub ensure_ascii: bool,
    /// Pretty-print with this indent string per level (Python's `indent=4` is four spaces).
    pub indent: Option<String>,
    /// `(item separator, key separator)`; Python's default is `(", ", ": ")`, or `(",", ": ")`
    /// when indenting.
    pub separators: Option<(String, String)>,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// Formats `v` exactly as Python's `json.dumps(v, **opts)` would (insertion-ordered objects,
/// `repr` floats, `NaN`/`Infinity` allowed).
pub fn json_dumps(v: &serde_json::Value, opts: &JsonOptions) -> String {
    let (item_sep, key_sep) = match &opts.separators {
        Some((a, b)) => (a.as_str(), b.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut out = String::new();
    write_json(&mut out, v, opts, item_sep, key_sep, 0);
    out
}

fn newline_indent(out: &mut String, opts: &JsonOptions, level: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(
    out: &mut String,
    v: &serde_json::Value,
    opts: &JsonOptions,
    item_sep: &str,
    key_sep: &str,
    level: usize,
) {
    use serde_json::Value as J;
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                out.push_str(&float_repr(n.as_f64().unwrap_or(f64::NAN), true));
            }
        }
        J::String(s) => write_json_str(out, s, opts.ensure_ascii),
        J::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(out, opts, level + 1);
                write_json(out, item, opts, item_sep, key_sep, level + 1);
            }
            newline_indent(out, opts, level);
            out.push(']');
        }
        J::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            if opts.sort_keys {
                // Python sorts str keys by code point, which is UTF-8 byte order.
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(out, opts, level + 1);
                write_json_str(out, k, opts.ensure_ascii);
                out.push_str(key_sep);
                write_json(out, item, opts, item_sep, key_sep, level + 1);
            }
            newline_indent(out, opts, level);
            out.push('}');
        }
    }
}

/// A JSON string literal as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`; with `ensure_ascii`, everything above 0x7F as `\uXXXX`
/// (UTF-16 surrogate pairs above the BMP).
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (`json` flavor when `json` is true: `NaN`, `Infinity`; otherwise
/// `nan`, `inf`): the shortest round-trip digits, scientific notation below 1e-4 and from 1e16.
pub fn float_repr(x: f64, json: bool) -> String {
    if x.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if x < 0.0 {
            format!("-{s}")
        } else {
            s.to_string()
        };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-5".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        let (int, frac) = digits.split_at(int_len);
        format!("{sign}{int}.{frac}")
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's
/// algorithm, proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Day count since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let (m, d) = (i64::from(m), i64::from(d));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats the UTC instant `unix_secs` with C/Python `strftime` directives: `%Y %y %m %d %e %H
/// %I %M %S %p %b %B %h %a %A %j %F %T %%`, and the glibc no-padding forms `%-d %-m %-H %-I %-M
/// %-S %-j`. Any other directive is an error naming it.
pub fn strftime(unix_secs: i64, fmt: &str) -> Result<String, String> {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let jan1 = days_from_civil(y, 1, 1);
    let yday = days - jan1 + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars
            .next()
            .ok_or("strftime: format ends with a lone `%`")?;
        let pad = if spec == '-' {
            spec = chars.next().ok_or("strftime: format ends with `%-`")?;
            false
        } else {
            true
        };
        let num = |out: &mut String, v: i64, width: usize| {
            if pad {
                let _ = write!(out, "{v:0width$}");
            } else {
                let _ = write!(out, "{v}");
            }
        };
        match spec {
            'Y' => {
                let _ = write!(out, "{y}");
            }
            'y' => num(&mut out, y.rem_euclid(100), 2),
            'm' => num(&mut out, m as i64, 2),
            'd' => num(&mut out, d as i64, 2),
            'e' => {
                let _ = write!(out, "{d:>2}");
            }
            'H' => num(&mut out, hh, 2),
            'I' => num(&mut out, h12, 2),
            'M' => num(&mut out, mm, 2),
            'S' => num(&mut out, ss, 2),
            'j' => num(&mut out, yday, 3),
            'p' => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            'b' | 'h' => out.push_str(&MONTHS[m as usize - 1][..3]),
            'B' => out.push_str(MONTHS[m as usize - 1]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'F' => {
                let _ = write!(out, "{y}-{m:02}-{d:02}");
            }
            'T' => {
                let _ = write!(out, "{hh:02}:{mm:02}:{ss:02}");
            }
            '%' => out.push('%'),
            other => return Err(format!("strftime: unsupported directive `%{other}`")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (9999999999999998.0, "9999999999999998.0"),
            (2.5e-5, "2.5e-05"),
            (1e22, "1e+22"),
            (1e300, "1e+300"),
            (-0.0, "-0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x, true), want, "{x:e}");
        }
        assert_eq!(float_repr(f64::NAN, true), "NaN");
        assert_eq!(float_repr(f64::NEG_INFINITY, true), "-Infinity");
    }

    #[test]
    fn json_dumps_matches_python() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b": [1, 2.5, "x\"y\n\u0001é😀"], "a": {}, "c": []}"#)
                .unwrap();
        let plain = JsonOptions::default();
        assert_eq!(
            json_dumps(&v, &plain),
            "{\"b\": [1, 2.5, \"x\\\"y\\n\\u0001é😀\"], \"a\": {}, \"c\": []}"
        );
        let opts = JsonOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            sort_keys: true,
            ..Default::default()
        };
        assert_eq!(
            json_dumps(&v, &opts),
            concat!(
                "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n",
                "    \"x\\\"y\\n\\u0001\\u00e9\\ud83d\\ude00\"\n  ],\n  \"c\": []\n}"
            )
        );
    }

    #[test]
    fn strftime_fixed_instant() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(
            strftime(t, "%d %b %Y|%B %-d|%A %a|%H:%M:%S %I%p|%j|%y|%F %T|%%").unwrap(),
            "29 Feb 2024|February 29|Thursday Thu|13:05:09 01PM|060|24|2024-02-29 13:05:09|%"
        );
        assert_eq!(
            strftime(0, "%Y-%m-%d %A %j").unwrap(),
            "1970-01-01 Thursday 001"
        );
        assert!(strftime(0, "%Q").unwrap_err().contains("%Q"));
    }
}

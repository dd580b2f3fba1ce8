//! llama.cpp's GBNF grammar format, translated to the Lark dialect the matcher compiles:
//! `name ::= ...` rules (any order; `root` is the start), string literals, character classes
//! `[a-z]` / `[^"\\]`, `.`, grouping, `|`, `*` `+` `?` and `{m,n}` repetition, `#` comments.
//! Rule names become `g_` + the name with `-` as `_`; character classes and `.` become
//! regular-expression lexemes (Lark reads `[x]` as "optional").

use crate::{Error, Result};

fn bad(line: usize, what: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("invalid GBNF grammar: line {line}: {what}"))
}

fn rule_name(name: &str) -> String {
    format!("g_{}", name.replace('-', "_").to_ascii_lowercase())
}

/// The Lark grammar equal to the GBNF grammar `src`.
pub fn to_lark(src: &str) -> Result<String> {
    let chars: Vec<char> = src.chars().collect();
    let (mut i, mut line) = (0usize, 1usize);
    // Rules in order: (name, body tokens as Lark text).
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut pending_ident: Option<String> = None;
    let flush_ident = |rules: &mut Vec<(String, Vec<String>)>,
                       ident: Option<String>,
                       line: usize|
     -> Result<()> {
        if let Some(id) = ident {
            match rules.last_mut() {
                Some(r) => r.1.push(rule_name(&id)),
                None => {
                    return Err(bad(
                        line,
                        format!("`{id}` outside a rule (expected `name ::= ...`)"),
                    ))
                }
            }
        }
        Ok(())
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                let Some(name) = pending_ident.take() else {
                    return Err(bad(line, "`::=` without a rule name before it"));
                };
                rules.push((name, Vec::new()));
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                flush_ident(&mut rules, pending_ident.take(), line)?;
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '-')
                {
                    i += 1;
                }
                pending_ident = Some(chars[start..i].iter().collect());
            }
            _ => {
                flush_ident(&mut rules, pending_ident.take(), line)?;
                let Some(rule) = rules.last_mut() else {
                    return Err(bad(line, format!("`{c}` before the first rule")));
                };
                match c {
                    '"' => {
                        let start = i;
                        i += 1;
                        let mut s = String::from("\"");
                        loop {
                            let Some(&ch) = chars.get(i) else {
                                return Err(bad(
                                    line,
                                    format!("unterminated string starting at column {}", start + 1),
                                ));
                            };
                            i += 1;
                            match ch {
                                '"' => break,
                                '\n' => {
                                    return Err(bad(
                                        line,
                                        "a string literal runs past the end of the line",
                                    ))
                                }
                                '\\' => {
                                    let Some(&e) = chars.get(i) else {
                                        return Err(bad(line, "a string literal ends in `\\`"));
                                    };
                                    i += 1;
                                    match e {
                                        'U' => {
                                            let hex: String = chars
                                                .get(i..i + 8)
                                                .map(|h| h.iter().collect())
                                                .unwrap_or_default();
                                            let ch = u32::from_str_radix(&hex, 16)
                                                .ok()
                                                .and_then(char::from_u32)
                                                .ok_or_else(|| {
                                                    bad(line, format!("bad escape \\U{hex}"))
                                                })?;
                                            i += 8;
                                            s.push_str(&format!("\\u{{{:x}}}", ch as u32));
                                        }
                                        _ => {
                                            s.push('\\');
                                            s.push(e);
                                        }
                                    }
                                }
                                ch => s.push(ch),
                            }
                        }
                        s.push('"');
                        rule.1.push(s);
                    }
                    '[' => {
                        let start = i;
                        i += 1;
                        let mut class = String::from("[");
                        loop {
                            let Some(&ch) = chars.get(i) else {
                                return Err(bad(
                                    line,
                                    format!(
                                        "unterminated character class starting at column {}",
                                        start + 1
                                    ),
                                ));
                            };
                            i += 1;
                            match ch {
                                ']' if class.len() > 1 && class != "[^" => break,
                                '\\' => {
                                    let Some(&e) = chars.get(i) else {
                                        return Err(bad(line, "a character class ends in `\\`"));
                                    };
                                    i += 1;
                                    class.push('\\');
                                    class.push(e);
                                }
                                '/' => class.push_str("\\/"),
                                '\n' => {
                                    return Err(bad(
                                        line,
                                        "a character class runs past the end of the line",
                                    ))
                                }
                                ch => class.push(ch),
                            }
                        }
                        class.push(']');
                        rule.1.push(format!("/{class}/"));
                    }
                    '.' => {
                        i += 1;
                        rule.1.push("/(?s:.)/".into());
                    }
                    '(' | ')' | '|' | '*' | '+' | '?' => {
                        i += 1;
                        rule.1.push(c.to_string());
                    }
                    '{' => {
                        let start = i;
                        while i < chars.len() && chars[i] != '}' {
                            i += 1;
                        }
                        if i >= chars.len() {
                            return Err(bad(line, "unterminated `{m,n}` repetition"));
                        }
                        i += 1;
                        let rep: String = chars[start..i]
                            .iter()
                            .filter(|c| !c.is_whitespace())
                            .collect();
                        let inner = &rep[1..rep.len() - 1];
                        let ok = !inner.is_empty()
                            && inner.split(',').count() <= 2
                            && inner
                                .split(',')
                                .enumerate()
                                .all(|(k, n)| (k == 1 && n.is_empty()) || n.parse::<u32>().is_ok());
                        if !ok {
                            return Err(bad(line, format!("bad repetition `{rep}`")));
                        }
                        rule.1.push(rep);
                    }
                    other => return Err(bad(line, format!("unexpected `{other}`"))),
                }
            }
        }
    }
    if let Some(id) = pending_ident.take() {
        flush_ident(&mut rules, Some(id), line)?;
    }
    if !rules.iter().any(|r| r.0 == "root") {
        return Err(bad(line, "no `root` rule"));
    }
    let mut out = String::from("start: g_root\n");
    for (name, body) in &rules {
        if body.is_empty() {
            return Err(bad(line, format!("rule `{name}` is empty")));
        }
        out.push_str(&format!("{}: {}\n", rule_name(name), body.join(" ")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_rules_classes_and_repetitions() {
        let g = to_lark(
            "root ::= \"The answer is \" number \".\"  # a comment\nnumber ::= [0-9]+ (\".\" [0-9]{1,3})?\n  | \"none\"\n",
        )
        .unwrap();
        assert_eq!(
            g,
            "start: g_root\ng_root: \"The answer is \" g_number \".\"\ng_number: /[0-9]/ + ( \".\" /[0-9]/ {1,3} ) ? | \"none\"\n"
        );
        assert!(to_lark("root ::= [^\"\\\\]* my-rule\nmy-rule ::= .")
            .unwrap()
            .contains("g_my_rule: /(?s:.)/"));
    }

    #[test]
    fn arbitrary_text_never_panics() {
        // GBNF-looking noise: every outcome is a grammar or an error, never a panic.
        let pieces = [
            "root", " ::= ", "\"", "\\", "[", "]", "^", "(", ")", "|", "*", "+", "?", "{", "}",
            "1", ",", "-", ".", "#", "\n", " ", "a", "é", "\\U", "\\x", "/", "::",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut src = String::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                src.push_str(pieces[(x % pieces.len() as u64) as usize]);
            }
            let _ = to_lark(&src);
        }
    }

    #[test]
    fn errors_name_the_line() {
        for (src, want) in [
            ("root ::= \"abc", "line 1: unterminated string"),
            ("x ::= \"a\"", "no `root` rule"),
            (
                "root ::= \"a\"\nb ::= [a-z",
                "line 2: unterminated character class",
            ),
            ("root ::= \"a\" {x}", "bad repetition"),
            ("\"a\"", "before the first rule"),
        ] {
            let e = to_lark(src).unwrap_err().to_string();
            assert!(e.contains(want), "{src:?}: {e}");
        }
    }
}

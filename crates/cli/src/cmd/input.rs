//! Texts from the command line or from a JSONL file (one object with a `"text"` field per
//! line). Errors name the file and line: invalid UTF-8, invalid JSON, a missing `text`.

use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context};

/// The texts to process: `--input FILE` lines (or `-` for stdin) followed by positional texts.
/// With neither, reads JSONL from stdin.
pub fn read_texts(input: Option<&Path>, texts: &[String]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    match input {
        Some(p) if p == Path::new("-") => {
            out.extend(read_jsonl(std::io::stdin().lock(), "<stdin>")?)
        }
        Some(p) => {
            let f =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            out.extend(read_jsonl(
                std::io::BufReader::new(f),
                &p.display().to_string(),
            )?);
        }
        None if texts.is_empty() => out.extend(read_jsonl(std::io::stdin().lock(), "<stdin>")?),
        None => {}
    }
    out.extend(texts.iter().cloned());
    Ok(out)
}

#[derive(serde::Deserialize)]
struct Line {
    text: Option<String>,
}

/// Parses JSONL from `reader`; `name` labels errors.
pub fn read_jsonl(mut reader: impl BufRead, name: &str) -> anyhow::Result<Vec<String>> {
    let mut texts = Vec::new();
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        line_no += 1;
        let n = reader
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("{name}: read error at line {line_no}"))?;
        if n == 0 {
            break;
        }
        let Ok(line) = std::str::from_utf8(&buf) else {
            bail!("{name}:{line_no}: line is not valid UTF-8");
        };
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(line)
            .with_context(|| format!("{name}:{line_no}: not a JSON object"))?;
        match parsed.text {
            Some(t) => texts.push(t),
            None => bail!("{name}:{line_no}: object has no string field \"text\""),
        }
    }
    Ok(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_reports_errors() {
        let ok = read_jsonl(&b"{\"text\": \"a\"}\n\n{\"text\": \"b\"}"[..], "f").unwrap();
        assert_eq!(ok, vec!["a", "b"]);
        let bad = read_jsonl(&b"{\"text\": \"a\"}\n{\"text\": \"\xff\"}\n"[..], "f").unwrap_err();
        assert!(
            bad.to_string().contains("f:2: line is not valid UTF-8"),
            "{bad}"
        );
        let missing = read_jsonl(&b"{\"txt\": 1}\n"[..], "f").unwrap_err();
        assert!(missing.to_string().contains("no string field"), "{missing}");
        assert!(read_jsonl(&b"nope\n"[..], "f").is_err());
    }
}

//! Decoders: token strings back to text, as HF's decoder chain does it: each decoder maps the
//! list of token strings to a new list, and the result is concatenated.
//!
//! - `WordPiece` glues `##` continuations to the previous token, puts a space before every other
//!   token, and (with `cleanup`) applies HF's `clean_up_tokenization` replacements;
//! - `ByteLevel` maps the byte-to-unicode spelling back to bytes (invalid UTF-8 becomes U+FFFD);
//! - `ByteFallback` turns runs of `<0xNN>` tokens into the text they spell (U+FFFD per byte if
//!   it is not valid UTF-8);
//! - `Fuse` joins everything into one string; `Replace` replaces a literal string in each token;
//!   `Strip` removes up to `start` / `stop` copies of a character from each token's ends;
//! - `Metaspace` turns `▁` back into spaces (dropping those of the first token);
//! - `Sequence` runs decoders in order. Without a decoder, tokens are joined with spaces.
//!
//! This module only joins strings; id lookup and special-token skipping are done by
//! [`super::Tokenizer::decode`].

use super::bpe::char_byte;

/// The decoder named in `tokenizer.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// `WordPiece` decoder.
    WordPiece {
        /// Continuing-subword prefix to strip (`##`).
        prefix: String,
        /// Apply HF's tokenization clean-up.
        cleanup: bool,
    },
    /// `ByteLevel` decoder.
    ByteLevel,
    /// `ByteFallback` decoder.
    ByteFallback,
    /// `Fuse` decoder.
    Fuse,
    /// `Replace` with a literal pattern.
    Replace {
        /// Text to find (never empty).
        pattern: String,
        /// Replacement.
        content: String,
    },
    /// `Strip`.
    Strip {
        /// The character to strip.
        content: char,
        /// How many to strip at the start of each token.
        start: usize,
        /// How many to strip at the end of each token.
        stop: usize,
    },
    /// `Metaspace`: the replacement back to spaces; unless its scheme is `never`, the first
    /// token loses every replacement character (as HF does).
    Metaspace {
        /// The space replacement (`▁`).
        replacement: char,
        /// Drop the replacement characters of the first token.
        strip_first: bool,
    },
    /// `Sequence`.
    Sequence(Vec<Decoder>),
    /// No decoder: join with single spaces.
    Join,
}

/// HF's `clean_up_tokenization`, in its order.
const CLEANUPS: [(&str, &str); 11] = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" do not", " don't"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
];

fn push_cleaned(out: &mut String, piece: &str) {
    // Most pieces contain none of the patterns; skip the replace chain for them.
    if !CLEANUPS.iter().any(|(from, _)| piece.contains(from)) {
        out.push_str(piece);
        return;
    }
    let mut s = piece.to_owned();
    for (from, to) in CLEANUPS {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    out.push_str(&s);
}

/// `<0xNN>` → NN.
fn byte_token(tok: &str) -> Option<u8> {
    let hex = tok.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn byte_fallback(tokens: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut bytes = Vec::new();
    let flush = |bytes: &mut Vec<u8>, out: &mut Vec<String>| {
        if bytes.is_empty() {
            return;
        }
        match String::from_utf8(std::mem::take(bytes)) {
            Ok(s) => out.push(s),
            Err(e) => {
                let n = e.as_bytes().len();
                out.extend(std::iter::repeat_n("\u{fffd}".to_owned(), n));
            }
        }
    };
    for tok in tokens {
        match byte_token(&tok) {
            Some(b) => bytes.push(b),
            None => {
                flush(&mut bytes, &mut out);
                out.push(tok);
            }
        }
    }
    flush(&mut bytes, &mut out);
    out
}

fn byte_level(tokens: Vec<String>) -> Vec<String> {
    let mut bytes = Vec::new();
    for tok in &tokens {
        let spelled: Option<Vec<u8>> = tok.chars().map(char_byte).collect();
        match spelled {
            Some(b) => bytes.extend(b),
            None => bytes.extend_from_slice(tok.as_bytes()),
        }
    }
    vec![String::from_utf8_lossy(&bytes).into_owned()]
}

fn strip(tok: &str, c: char, start: usize, stop: usize) -> String {
    let mut s = tok;
    for _ in 0..start {
        match s.strip_prefix(c) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    for _ in 0..stop {
        match s.strip_suffix(c) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    s.to_owned()
}

impl Decoder {
    /// The bytes one vocabulary token adds to decoded text in the middle of a sequence (what
    /// grammar-constrained decoding matches tokens by): the per-token steps (`Replace`,
    /// `Metaspace`, `ByteFallback`, `ByteLevel`) applied to it alone; the steps that act on the
    /// text's ends (`Strip`, the first token's `Metaspace` space) do not apply there.
    pub fn token_bytes(&self, tok: &str) -> Vec<u8> {
        fn walk(d: &Decoder, s: &mut String) -> Option<Vec<u8>> {
            match d {
                Decoder::Replace { pattern, content } => *s = s.replace(pattern.as_str(), content),
                Decoder::Metaspace { replacement, .. } => {
                    *s = s.replace(*replacement, " ");
                }
                Decoder::ByteFallback => {
                    let hex = s.strip_prefix("<0x").and_then(|r| r.strip_suffix('>'));
                    if let Some(b) = hex
                        .filter(|h| h.len() == 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                    {
                        return Some(vec![b]);
                    }
                }
                Decoder::ByteLevel => {
                    let spelled: Option<Vec<u8>> = s.chars().map(char_byte).collect();
                    return Some(spelled.unwrap_or_else(|| s.as_bytes().to_vec()));
                }
                Decoder::Sequence(list) => {
                    for d in list {
                        if let Some(b) = walk(d, s) {
                            return Some(b);
                        }
                    }
                }
                Decoder::WordPiece { prefix, .. } => match s.strip_prefix(prefix.as_str()) {
                    Some(rest) => *s = rest.to_owned(),
                    None => s.insert(0, ' '),
                },
                Decoder::Fuse | Decoder::Strip { .. } | Decoder::Join => {}
            }
            None
        }
        let mut s = tok.to_owned();
        walk(self, &mut s).unwrap_or_else(|| s.into_bytes())
    }

    /// Whether a `ByteLevel` decoder is present (the model then spells words byte-level).
    pub fn is_byte_level(&self) -> bool {
        match self {
            Decoder::ByteLevel => true,
            Decoder::Sequence(list) => list.iter().any(Decoder::is_byte_level),
            _ => false,
        }
    }

    /// Joins `tokens` into text.
    pub fn decode<'a>(&self, tokens: impl IntoIterator<Item = &'a str>) -> String {
        let tokens: Vec<String> = tokens.into_iter().map(str::to_owned).collect();
        if *self == Decoder::Join {
            return tokens.join(" ");
        }
        self.chain(tokens).concat()
    }

    /// One step of HF's `decode_chain`.
    fn chain(&self, tokens: Vec<String>) -> Vec<String> {
        match self {
            Decoder::Join => vec![tokens.join(" ")],
            Decoder::WordPiece { prefix, cleanup } => tokens
                .iter()
                .enumerate()
                .map(|(i, tok)| {
                    let mut piece = String::new();
                    if i == 0 {
                        piece.push_str(tok);
                    } else if let Some(rest) = tok.strip_prefix(prefix.as_str()) {
                        piece.push_str(rest);
                    } else {
                        piece.push(' ');
                        piece.push_str(tok);
                    }
                    if *cleanup {
                        let mut out = String::new();
                        push_cleaned(&mut out, &piece);
                        out
                    } else {
                        piece
                    }
                })
                .collect(),
            Decoder::ByteLevel => byte_level(tokens),
            Decoder::ByteFallback => byte_fallback(tokens),
            Decoder::Fuse => vec![tokens.concat()],
            Decoder::Replace { pattern, content } => tokens
                .into_iter()
                .map(|t| t.replace(pattern.as_str(), content))
                .collect(),
            Decoder::Strip {
                content,
                start,
                stop,
            } => tokens
                .iter()
                .map(|t| strip(t, *content, *start, *stop))
                .collect(),
            Decoder::Metaspace {
                replacement,
                strip_first,
            } => tokens
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let drop = i == 0 && *strip_first;
                    t.chars()
                        .filter_map(|c| match c {
                            c if c != *replacement => Some(c),
                            _ if drop => None,
                            _ => Some(' '),
                        })
                        .collect()
                })
                .collect(),
            Decoder::Sequence(list) => list.iter().fold(tokens, |t, d| d.chain(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wordpiece_joins_and_cleans() {
        let d = Decoder::WordPiece {
            prefix: "##".into(),
            cleanup: true,
        };
        assert_eq!(d.decode(["##6", "hello", "."]), "##6 hello.");
        assert_eq!(
            d.decode(["un", "##aff", "##able", "!", "'", "s"]),
            "unaffable! ' s"
        );
        assert_eq!(Decoder::Join.decode(["a", "##b"]), "a ##b");
    }

    #[test]
    fn sentencepiece_chain() {
        let d = Decoder::Sequence(vec![
            Decoder::Replace {
                pattern: "▁".into(),
                content: " ".into(),
            },
            Decoder::ByteFallback,
            Decoder::Fuse,
            Decoder::Strip {
                content: ' ',
                start: 1,
                stop: 0,
            },
        ]);
        assert_eq!(
            d.decode(["▁Hi", "<0xC3>", "<0xA9>", "▁x", "<0xFF>"]),
            "Hié x\u{fffd}"
        );
        assert_eq!(
            Decoder::ByteLevel.decode(["Hello", "Ġw", "Ã©", "<|x|>"]),
            "Hello wé<|x|>"
        );
    }
}

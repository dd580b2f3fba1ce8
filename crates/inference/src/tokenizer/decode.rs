//! Decoders: token strings back to text. The WordPiece decoder glues `##` continuations to the
//! previous token, puts a space before every other token, and (with `cleanup`) applies HF's
//! `clean_up_tokenization` replacements to each token. Without a decoder, tokens are joined with
//! spaces. This module only joins strings; id lookup and special-token skipping are done by
//! [`super::Tokenizer::decode`].

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

impl Decoder {
    /// Joins `tokens` into text.
    pub fn decode<'a>(&self, tokens: impl IntoIterator<Item = &'a str>) -> String {
        let mut out = String::new();
        match self {
            Decoder::Join => {
                for (i, tok) in tokens.into_iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    out.push_str(tok);
                }
            }
            Decoder::WordPiece { prefix, cleanup } => {
                let mut piece = String::new();
                for (i, tok) in tokens.into_iter().enumerate() {
                    piece.clear();
                    if i == 0 {
                        piece.push_str(tok);
                    } else if let Some(rest) = tok.strip_prefix(prefix.as_str()) {
                        piece.push_str(rest);
                    } else {
                        piece.push(' ');
                        piece.push_str(tok);
                    }
                    if *cleanup {
                        push_cleaned(&mut out, &piece);
                    } else {
                        out.push_str(&piece);
                    }
                }
            }
        }
        out
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
}

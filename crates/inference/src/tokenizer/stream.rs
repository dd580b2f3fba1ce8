//! Incremental decoding for streamed generation: push ids one at a time and get the text they
//! add, never a piece that ends inside a multi-byte character. Follows HF's `DecodeStream`: the
//! ids since the last emitted piece are decoded together with a few ids before them (the
//! prefix), and text is released only once it grew and does not end with U+FFFD, the mark of
//! an unfinished byte sequence. This module only slices decoder output; decoding itself is
//! [`super::Tokenizer::decode`].

use super::Tokenizer;

/// A streaming decoder over one tokenizer; see [`Tokenizer::decode_stream`].
#[derive(Debug, Clone)]
pub struct DecodeStream<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    /// The window: prefix ids, then ids not yet released as text.
    ids: Vec<u32>,
    /// Decoded text of the prefix ids.
    prefix: String,
    /// Number of prefix ids at the start of `ids`.
    prefix_index: usize,
}

/// Length of the longest common prefix of `a` and `b` that ends on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

impl<'a> DecodeStream<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Adds one id; returns the text it completes, or `None` while the text is unfinished.
    pub fn step(&mut self, id: u32) -> Option<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens);
        if text.len() <= self.prefix.len() || text.ends_with('\u{fffd}') {
            return None;
        }
        // The decoders are context-free past the prefix, so `text` extends `prefix`; should a
        // decoder ever rewrite it, release what differs instead of failing.
        let keep = if text.starts_with(self.prefix.as_str()) {
            self.prefix.len()
        } else {
            common_prefix(&text, &self.prefix)
        };
        let piece = text[keep..].to_owned();
        let new_prefix_index = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = self.tokenizer.decode(&self.ids, self.skip_special_tokens);
        self.prefix_index = new_prefix_index;
        Some(piece)
    }
}

impl Tokenizer {
    /// A streaming decoder: feed it generated ids with [`DecodeStream::step`]; the pieces it
    /// returns concatenate to the text `decode` gives for all ids (up to a trailing unfinished
    /// character).
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream<'_> {
        DecodeStream::new(self, skip_special_tokens)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn common_prefix_stops_at_char_boundary() {
        assert_eq!(super::common_prefix("abé", "abè"), 2);
        assert_eq!(super::common_prefix("ab", "abc"), 2);
    }
}

//! Stop strings over streamed text.
//!
//! [`StopMatcher`] sits between detokenization and the client: text goes in piece by piece, and
//! it releases only what can no longer turn out to be the start of a stop string. It owns no
//! tokens and no decoding; a stop split over several pieces (or several tokens) is found all the
//! same, and the stop string itself is never emitted.

/// Finds the first stop string in a stream of text pieces.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    /// The stop strings (empty ones dropped).
    stops: Vec<String>,
    /// Text received but not yet released: a suffix that could still start a stop string.
    held: String,
    /// True once a stop string was found; later pushes return `Stop("")`.
    stopped: bool,
}

/// What a [`StopMatcher::push`] released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopResult {
    /// No stop yet; the text is safe to emit now (possibly empty while a prefix is held back).
    Continue(String),
    /// A stop string was found: the not-yet-emitted text before it. Generation should end.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored, and with no stops every push is
    /// released at once.
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds the next piece of text. On a match, the earliest-starting stop string wins and the
    /// text after it is dropped.
    pub fn push(&mut self, text: &str) -> StopResult {
        if self.stopped {
            return StopResult::Stop(String::new());
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            self.held.truncate(at);
            return StopResult::Stop(std::mem::take(&mut self.held));
        }
        let keep = self.held_back_len();
        let release = self.held.len() - keep;
        let rest = self.held.split_off(release);
        StopResult::Continue(std::mem::replace(&mut self.held, rest))
    }

    /// Releases the text still held back (the stream ended without a stop). Empty after a stop.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// True once a stop string has been seen.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    /// Suffixes start on char boundaries, so what is released is always whole UTF-8 characters.
    fn held_back_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let h = self.held.as_str();
        let from = h.len().saturating_sub(longest.saturating_sub(1));
        for (start, _) in h.char_indices().skip_while(|&(i, _)| i < from) {
            let tail = &h[start..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                return tail.len();
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_stops_releases_everything() {
        let mut m = StopMatcher::new(vec![String::new()]);
        assert_eq!(m.push("abc"), StopResult::Continue("abc".into()));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn holds_a_possible_prefix() {
        let mut m = StopMatcher::new(vec!["</s>".into()]);
        assert_eq!(m.push("hi <"), StopResult::Continue("hi ".into()));
        assert_eq!(m.push("/x"), StopResult::Continue("</x".into()));
        assert_eq!(m.push(" </"), StopResult::Continue(" ".into()));
        assert_eq!(m.push("s> tail"), StopResult::Stop(String::new()));
        assert!(m.is_stopped());
        assert_eq!(m.push("more"), StopResult::Stop(String::new()));
        assert_eq!(m.finish(), "");
    }
}

//! The DFA engine's automata: a regular expression compiled by `regex-automata` into an
//! anchored byte automaton, either a dense DFA determinized at compile time and copied into a
//! table of its live states ([`Backend::Dense`]) or a lazy DFA determinized while masks walk the
//! token trie ([`Backend::Lazy`]), each with its per-state caches (allowed-token bit sets and
//! string room); and the state operations masks and matchers use (start, run, accepting,
//! final).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::hybrid::{self, LazyStateID};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::Hir;

use super::schema::invalid;
use super::trie::{char_paths, Tokens};
use crate::{Error, Result};

/// The most bytes a schema's NFA, and its dense DFA, may take; larger schemas are refused.
pub const DFA_SIZE_LIMIT: usize = 64 << 20;

/// The most bytes the NFA of a schema may take before the DFA is built.
const NFA_SIZE_LIMIT: usize = DFA_SIZE_LIMIT;

/// Which automaton a schema is compiled to; both give the same masks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// A dense DFA, fully determinized at compile time (`regex_automata::dfa::dense`) and
    /// copied into a table of its live states: slower to compile, no work left for masks but
    /// the trie walks.
    Dense,
    /// A lazy DFA (`regex_automata::hybrid`), determinized on demand while masks walk the trie:
    /// compiles in the time of the NFA, and pays for each DFA state on its first visit.
    #[default]
    Lazy,
}

/// The end of the output: appended to the lazy DFA's expression so that it matches only after
/// this byte, which no UTF-8 text (so no usable token) holds. A state is then live exactly
/// when it is not dead, and accepting when this byte leads somewhere.
const END: u8 = 0xff;

/// The most bytes a lazy DFA's cache may grow to (it is never cleared: cached masks are keyed
/// by its state ids); a constraint that needs more fails its masks.
const LAZY_CACHE_LIMIT: usize = 256 << 20;

fn too_large(what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::InvalidInput(format!(
        "JSON schema: too large for the DFA engine ({what}: {e})"
    ))
}

fn nfa(hir: &Hir) -> Result<thompson::NFA> {
    thompson::Compiler::new()
        .configure(
            thompson::Config::new()
                .which_captures(WhichCaptures::None)
                .nfa_size_limit(Some(NFA_SIZE_LIMIT)),
        )
        .build_from_hir(hir)
        .map_err(|e| too_large("NFA", &e))
}

/// A DFA over bytes with only live states: state offsets are premultiplied by the number of
/// byte classes, 0 is the dead state.
pub(super) struct Table {
    classes: [u8; 256],
    stride: usize,
    trans: Vec<u32>,
    start: u32,
    accepting: Vec<bool>,
    /// Accepting with no live transition.
    finals: Vec<bool>,
    /// The allowed-token bit set of each state, computed on first visit.
    masks: Vec<OnceLock<Arc<[u32]>>>,
    /// The string room of the states seen (see `Tokens::capacity`).
    rooms: Mutex<HashMap<u32, Option<usize>>>,
}

impl Table {
    /// The live-state table of `hir`'s dense DFA (an error when it has no valid value or is
    /// too large).
    pub(super) fn build(hir: &Hir) -> Result<Self> {
        let nfa = nfa(hir)?;
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .accelerate(false)
                    .minimize(false)
                    .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                    .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| too_large("dense DFA", &e))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| too_large("start state", &e))?;
        let bc = dfa.byte_classes();
        let stride = bc.alphabet_len() - 1;
        let mut classes = [0u8; 256];
        let mut reps = vec![None; stride];
        for b in 0..=255u8 {
            let c = bc.get(b);
            classes[b as usize] = c;
            reps[c as usize].get_or_insert(b);
        }
        // Every reachable state, breadth first (dead ones as u32::MAX).
        let mut ids: HashMap<StateID, u32> = HashMap::new();
        let mut order = vec![start];
        ids.insert(start, 0);
        let mut raw: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let s = order[i];
            for r in &reps {
                let next = r.map(|b| dfa.next_state(s, b));
                raw.push(match next {
                    Some(n) if !dfa.is_dead_state(n) && !dfa.is_quit_state(n) => {
                        let id = ids.len() as u32;
                        *ids.entry(n).or_insert_with(|| {
                            order.push(n);
                            id
                        })
                    }
                    _ => u32::MAX,
                });
            }
            i += 1;
        }
        let n = order.len();
        let accepting: Vec<bool> = order
            .iter()
            .map(|&s| dfa.is_match_state(dfa.next_eoi_state(s)))
            .collect();
        // Live: an accepting state is reachable.
        let mut back: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (s, row) in raw.chunks(stride).enumerate() {
            for &t in row {
                if t != u32::MAX {
                    back[t as usize].push(s as u32);
                }
            }
        }
        let mut live = accepting.clone();
        let mut queue: Vec<u32> = (0..n as u32).filter(|&s| live[s as usize]).collect();
        while let Some(t) = queue.pop() {
            for &s in &back[t as usize] {
                if !live[s as usize] {
                    live[s as usize] = true;
                    queue.push(s);
                }
            }
        }
        if !live[0] {
            return Err(invalid("no value is valid", "#"));
        }
        // Renumber: dead = 0, live states from 1, offsets premultiplied.
        let mut new = vec![0u32; n];
        let mut m = 1;
        for s in 0..n {
            if live[s] {
                new[s] = m * stride as u32;
                m += 1;
            }
        }
        let mut trans = vec![0u32; m as usize * stride];
        let mut acc = vec![false; m as usize];
        let mut finals = vec![false; m as usize];
        for s in (0..n).filter(|&s| live[s]) {
            let row = new[s] as usize;
            for (c, &t) in raw[s * stride..(s + 1) * stride].iter().enumerate() {
                if t != u32::MAX && live[t as usize] {
                    trans[row + c] = new[t as usize];
                }
            }
            let idx = row / stride;
            acc[idx] = accepting[s];
            finals[idx] = accepting[s] && trans[row..row + stride].iter().all(|&t| t == 0);
        }
        Ok(Self {
            classes,
            stride,
            trans,
            start: new[0],
            accepting: acc,
            finals,
            masks: (0..m).map(|_| OnceLock::new()).collect(),
            rooms: Mutex::new(HashMap::new()),
        })
    }

    /// The state after byte `b` (0: dead).
    #[inline]
    fn next(&self, s: u32, b: u8) -> u32 {
        self.trans[s as usize + self.classes[b as usize] as usize]
    }

    /// Whether `bytes` is a complete output.
    pub(super) fn matches(&self, bytes: &[u8]) -> bool {
        let s = self.run(self.start, bytes);
        s != 0 && self.accepting[s as usize / self.stride]
    }

    /// The state after `bytes` (0: dead).
    fn run(&self, mut s: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            s = self.next(s, b);
            if s == 0 {
                break;
            }
        }
        s
    }
}

/// A lazy DFA of the expression followed by [`END`], its cache (shared by the constraint's
/// matchers) and the masks of the states visited.
pub(super) struct Lazy {
    dfa: hybrid::dfa::DFA,
    cache: Mutex<hybrid::dfa::Cache>,
    start: LazyStateID,
    /// One byte of each class but [`END`]'s.
    reps: Vec<u8>,
    masks: Mutex<HashMap<LazyStateID, Arc<[u32]>>>,
    /// The string room of the states seen (see `Tokens::capacity`).
    rooms: Mutex<HashMap<LazyStateID, Option<usize>>>,
}

/// The error of a lazy DFA whose cache is full.
pub(super) fn cache_full(e: &dyn std::fmt::Display) -> Error {
    Error::InvalidInput(format!("constraint: lazy DFA cache exhausted ({e})"))
}

impl Lazy {
    /// The lazy DFA of `hir` followed by [`END`].
    pub(super) fn build(hir: &Hir) -> Result<Self> {
        let nfa = nfa(&Hir::concat(vec![hir.clone(), Hir::literal([END])]))?;
        let dfa = hybrid::dfa::Builder::new()
            .configure(
                hybrid::dfa::Config::new()
                    .match_kind(MatchKind::All)
                    .cache_capacity(LAZY_CACHE_LIMIT)
                    .minimum_cache_clear_count(Some(0)),
            )
            .build_from_nfa(nfa)
            .map_err(|e| too_large("lazy DFA", &e))?;
        let mut cache = dfa.create_cache();
        let start = dfa
            .start_state(&mut cache, &start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| too_large("start state", &e))?;
        let bc = dfa.byte_classes();
        let end_class = bc.get(END);
        let mut reps = Vec::new();
        let mut seen = vec![false; bc.alphabet_len()];
        for b in 0..=255u8 {
            let c = bc.get(b) as usize;
            if !seen[c] && c != end_class as usize {
                reps.push(b);
            }
            seen[c] = true;
        }
        Ok(Self {
            dfa,
            cache: Mutex::new(cache),
            start,
            reps,
            masks: Mutex::new(HashMap::new()),
            rooms: Mutex::new(HashMap::new()),
        })
    }

    /// The lazy DFA's cache, locked.
    fn cache(&self) -> MutexGuard<'_, hybrid::dfa::Cache> {
        lock(&self.cache)
    }

    /// The state after `bytes` (`None`: dead).
    fn run(
        &self,
        cache: &mut hybrid::dfa::Cache,
        mut s: LazyStateID,
        bytes: &[u8],
    ) -> Result<Option<LazyStateID>> {
        for &b in bytes {
            s = self
                .dfa
                .next_state(cache, s, b)
                .map_err(|e| cache_full(&e))?;
            if s.is_dead() {
                return Ok(None);
            }
        }
        Ok(Some(s))
    }

    /// Whether the output may end in state `s`.
    fn accepting(&self, cache: &mut hybrid::dfa::Cache, s: LazyStateID) -> Result<bool> {
        Ok(self.run(cache, s, &[END])?.is_some())
    }

    fn is_final(&self, s: LazyStateID) -> Result<bool> {
        let mut cache = self.cache();
        if !self.accepting(&mut cache, s)? {
            return Ok(false);
        }
        for &b in &self.reps {
            if self.run(&mut cache, s, &[b])?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A compiled automaton of either backend.
pub(super) enum Auto {
    Dense(Box<Table>),
    Lazy(Box<Lazy>),
}

/// A state of either automaton.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Dense(u32),
    Lazy(LazyStateID),
}

fn other_automaton() -> Error {
    Error::InvalidInput("constraint: state of another automaton".into())
}

impl Auto {
    /// The automaton of `hir` on `backend`.
    pub(super) fn build(hir: &Hir, backend: Backend) -> Result<Self> {
        Ok(match backend {
            Backend::Dense => Auto::Dense(Box::new(Table::build(hir)?)),
            Backend::Lazy => Auto::Lazy(Box::new(Lazy::build(hir)?)),
        })
    }

    /// The number of live states of a dense automaton (`None` for a lazy one).
    pub(super) fn states(&self) -> Option<usize> {
        match self {
            Auto::Dense(t) => Some(t.accepting.len() - 1),
            Auto::Lazy(_) => None,
        }
    }

    /// One byte string per combination of the automaton's byte classes that a safe JSON
    /// string character can take (see [`char_paths`]).
    pub(super) fn char_paths(&self) -> Vec<Vec<u8>> {
        match self {
            Auto::Dense(t) => char_paths(|b| t.classes[b as usize]),
            Auto::Lazy(l) => char_paths(|b| l.dfa.byte_classes().get(b)),
        }
    }

    /// The state at the start of the output.
    pub(super) fn start(&self) -> State {
        match self {
            Auto::Dense(t) => State::Dense(t.start),
            Auto::Lazy(l) => State::Lazy(l.start),
        }
    }

    /// The state after `bytes` (`None`: dead).
    pub(super) fn run(&self, s: State, bytes: &[u8]) -> Result<Option<State>> {
        Ok(match (self, s) {
            (Auto::Dense(t), State::Dense(s)) => {
                Some(t.run(s, bytes)).filter(|&s| s != 0).map(State::Dense)
            }
            (Auto::Lazy(l), State::Lazy(s)) => l.run(&mut l.cache(), s, bytes)?.map(State::Lazy),
            _ => return Err(other_automaton()),
        })
    }

    /// Whether the output may end in state `s`.
    pub(super) fn accepting(&self, s: State) -> Result<bool> {
        match (self, s) {
            (Auto::Dense(t), State::Dense(s)) => Ok(t.accepting[s as usize / t.stride]),
            (Auto::Lazy(l), State::Lazy(s)) => l.accepting(&mut l.cache(), s),
            _ => Err(other_automaton()),
        }
    }

    /// Whether state `s` is accepting with no live continuation.
    pub(super) fn is_final(&self, s: State) -> Result<bool> {
        match (self, s) {
            (Auto::Dense(t), State::Dense(s)) => Ok(t.finals[s as usize / t.stride]),
            (Auto::Lazy(l), State::Lazy(s)) => l.is_final(s),
            _ => Err(other_automaton()),
        }
    }

    /// The tokens of `tokens` allowed in state `s` (`chars`: [`Self::char_paths`]), from the
    /// state's cached bit set or by a walk of the trie, then cached.
    pub(super) fn allowed(
        &self,
        s: State,
        tokens: &Tokens,
        chars: &[Vec<u8>],
    ) -> Result<Arc<[u32]>> {
        match (self, s) {
            (Auto::Dense(t), State::Dense(s)) => Ok(t.masks[s as usize / t.stride]
                .get_or_init(|| {
                    let acc = t.accepting[s as usize / t.stride];
                    let mut rooms = lock(&t.rooms);
                    tokens.allowed(s, acc, chars, &mut rooms, |s, b| {
                        Some(t.next(s, b)).filter(|&n| n != 0)
                    })
                })
                .clone()),
            (Auto::Lazy(l), State::Lazy(s)) => {
                if let Some(m) = lock(&l.masks).get(&s) {
                    return Ok(m.clone());
                }
                let mut cache = l.cache();
                let acc = l.accepting(&mut cache, s)?;
                let mut failed = None;
                let mut rooms = lock(&l.rooms);
                let bits = tokens.allowed(s, acc, chars, &mut rooms, |s, b| {
                    match l.dfa.next_state(&mut cache, s, b) {
                        Ok(n) => Some(n).filter(|n| !n.is_dead()),
                        Err(e) => {
                            failed = Some(cache_full(&e));
                            None
                        }
                    }
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                Ok(lock(&l.masks).entry(s).or_insert(bits).clone())
            }
            _ => Err(other_automaton()),
        }
    }
}

/// `m` locked (a panic elsewhere leaves the caches consistent: entries are whole).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

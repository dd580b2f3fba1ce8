//! What attention kernels read of a sequence's memory: [`KvRows`] (a run of stored rows, f32 or
//! f16) and [`KvView`] (one layer's keys or values of one sequence, as the pages of its page
//! table). The view is owned here, not by a kernel, so every backend reads the same thing.

use std::ops::Range;

use half::f16;

/// Stored key or value rows: f32 or f16, row-major.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    /// f32 rows.
    F32(&'a [f32]),
    /// f16 rows (widened to f32 on load).
    F16(&'a [f16]),
}

impl<'a> KvRows<'a> {
    /// The rows without their first `n` values (panics if there are fewer).
    pub fn skip(self, n: usize) -> KvRows<'a> {
        match self {
            KvRows::F32(x) => KvRows::F32(&x[n..]),
            KvRows::F16(x) => KvRows::F16(&x[n..]),
        }
    }

    /// Number of stored values.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) => x.len(),
        }
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values `range` as f32 (a copy; widened exactly from f16).
    pub fn to_f32(&self, range: Range<usize>) -> Vec<f32> {
        let mut out = Vec::with_capacity(range.len());
        self.extend_f32(range, &mut out);
        out
    }

    /// Appends the values `range` to `out` as f32.
    pub fn extend_f32(&self, range: Range<usize>, out: &mut Vec<f32>) {
        match self {
            KvRows::F32(x) => out.extend_from_slice(&x[range]),
            KvRows::F16(x) => out.extend(x[range].iter().map(|h| h.to_f32())),
        }
    }

    /// Whether both are stored in the same type.
    pub fn same_dtype(&self, other: &KvRows<'_>) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// One attention layer's cached keys (or values) of one sequence: `rows` rows of `ld` values,
/// held in pages of `page_rows` rows each (the last page may be partly filled). Row `r` is row
/// `r % page_rows` of page `r / page_rows`. A contiguous buffer is the one-page case.
#[derive(Clone, Debug)]
pub struct KvView<'a> {
    pages: Vec<KvRows<'a>>,
    page_rows: usize,
    rows: usize,
    ld: usize,
}

impl<'a> KvView<'a> {
    /// A view over `pages` (each holding at least `page_rows * ld` values, the last at least
    /// what `rows` needs), all of one dtype.
    ///
    /// Panics if the pages cannot hold `rows` rows (a caller bug).
    pub fn new(pages: Vec<KvRows<'a>>, page_rows: usize, rows: usize, ld: usize) -> Self {
        assert!(
            page_rows > 0 && ld > 0,
            "a KV view needs rows of some width"
        );
        assert!(
            rows <= pages.len() * page_rows,
            "{rows} rows do not fit in {} pages of {page_rows}",
            pages.len()
        );
        for (i, p) in pages.iter().enumerate() {
            let held = rows.saturating_sub(i * page_rows).min(page_rows);
            assert!(p.len() >= held * ld, "page {i} is too short for its rows");
            assert!(p.same_dtype(&pages[0]), "pages of different dtypes");
        }
        Self {
            pages,
            page_rows,
            rows,
            ld,
        }
    }

    /// The view of the first `rows` rows (at most all of them).
    pub fn prefix(&self, rows: usize) -> KvView<'a> {
        let rows = rows.min(self.rows);
        let pages = rows.div_ceil(self.page_rows).max(1).min(self.pages.len());
        Self {
            pages: self.pages[..pages].to_vec(),
            page_rows: self.page_rows,
            rows,
            ld: self.ld,
        }
    }

    /// A view of one contiguous buffer of `rows.len() / ld` rows.
    pub fn contiguous(rows: KvRows<'a>, ld: usize) -> Self {
        let n = rows.len() / ld;
        Self {
            pages: vec![rows],
            page_rows: n.max(1),
            rows: n,
            ld,
        }
    }

    /// Rows in the view.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether the view holds no row.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Values per row.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// Rows per page.
    pub fn page_rows(&self) -> usize {
        self.page_rows
    }

    /// The pages (row `r` of page `p` starts at value `r * ld`).
    pub fn pages(&self) -> &[KvRows<'a>] {
        &self.pages
    }

    /// Whether the rows are f16.
    pub fn is_f16(&self) -> bool {
        matches!(self.pages.first(), Some(KvRows::F16(_)))
    }

    /// The rows `range` as contiguous runs, in order: `(first row, stored values from that
    /// row's start to its page's end, rows in the run)`. Kernels walk these.
    pub fn segments(
        &self,
        range: Range<usize>,
    ) -> impl Iterator<Item = (usize, KvRows<'a>, usize)> + '_ {
        assert!(
            range.end <= self.rows,
            "rows {range:?} of a view of {}",
            self.rows
        );
        let mut r = range.start;
        std::iter::from_fn(move || {
            if r >= range.end {
                return None;
            }
            let (p, o) = (r / self.page_rows, r % self.page_rows);
            let n = (self.page_rows - o).min(range.end - r);
            let page = self.pages[p];
            let seg = (r, page.skip(o * self.ld), n);
            r += n;
            Some(seg)
        })
    }

    /// The rows `range` as one contiguous f32 buffer ([rows, ld]; widened exactly from f16).
    pub fn gather_f32(&self, range: Range<usize>) -> Vec<f32> {
        let mut out = Vec::with_capacity(range.len() * self.ld);
        for (_, seg, n) in self.segments(range) {
            seg.extend_f32(0..n * self.ld, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cross_pages() {
        let a: Vec<f32> = (0..8).map(|x| x as f32).collect(); // 4 rows of 2
        let b: Vec<f32> = (8..16).map(|x| x as f32).collect();
        let c: Vec<f32> = (16..18).map(|x| x as f32).collect(); // 1 row
        let v = KvView::new(
            vec![KvRows::F32(&a), KvRows::F32(&b), KvRows::F32(&c)],
            4,
            9,
            2,
        );
        let segs: Vec<(usize, usize)> = v.segments(3..9).map(|(r, _, n)| (r, n)).collect();
        assert_eq!(segs, vec![(3, 1), (4, 4), (8, 1)]);
        assert_eq!(v.gather_f32(3..6), vec![6., 7., 8., 9., 10., 11.]);
        assert_eq!(v.gather_f32(0..9).len(), 18);
        let whole = KvView::contiguous(KvRows::F32(&a), 2);
        assert_eq!(whole.rows(), 4);
        assert_eq!(whole.gather_f32(1..3), vec![2., 3., 4., 5.]);
    }
}

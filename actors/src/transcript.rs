//! Reading a transcript in bounded pages.
//!
//! Why this exists: an agent decides how much it writes, so a session's
//! transcript can grow to gigabytes (a thousand 1 MiB tool calls, many turns
//! of capped text). Every reader (the HTTP API, `ctl log`, the console, the
//! MCP `reboot` tool, Slack's "remember this") reads a [`TranscriptPage`]:
//! at most [`TranscriptPage::limit`] entries and about
//! [`TranscriptPage::max_bytes`] of content, never the whole of it. Both
//! stores fill a page with the same [`PageFill`], so the bounds mean the
//! same everywhere.

use crate::model::{MessageKind, TranscriptEntry};

/// Entries in a page when the reader does not say.
pub const DEFAULT_LIMIT: usize = 1000;
/// The most entries a reader may ask for in one page.
pub const MAX_LIMIT: usize = 5000;
/// About how many bytes of content one page carries (always at least one
/// entry, whatever its size).
pub const MAX_PAGE_BYTES: usize = 8 << 20;

/// Where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The newest entries.
    Latest,
    /// The newest entries older than this id (paging back).
    Before(i64),
    /// The oldest entries newer than this id (catching up).
    After(i64),
}

/// Which slice of a transcript to read, and its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TranscriptPage {
    /// Where the slice is anchored.
    pub anchor: Anchor,
    /// At most this many entries.
    pub limit: usize,
    /// At most about this many bytes of content.
    pub max_bytes: usize,
    /// Only entries of this kind (the latest plan: `Plan`, limit 1).
    pub kind: Option<MessageKind>,
}

impl TranscriptPage {
    /// The newest entries, with the default bounds.
    pub const LATEST: TranscriptPage = TranscriptPage {
        anchor: Anchor::Latest,
        limit: DEFAULT_LIMIT,
        max_bytes: MAX_PAGE_BYTES,
        kind: None,
    };

    /// The latest entry of one kind (the current plan, say).
    pub fn latest_of(kind: MessageKind) -> TranscriptPage {
        TranscriptPage {
            limit: 1,
            kind: Some(kind),
            ..TranscriptPage::LATEST
        }
    }

    /// True when entries are read newest first (then returned oldest first).
    pub fn newest_first(&self) -> bool {
        !matches!(self.anchor, Anchor::After(_))
    }

    /// The id bound for a store's query: entries with an id below it
    /// ([`TranscriptPage::newest_first`]) or above it.
    pub fn bound(&self) -> i64 {
        match self.anchor {
            Anchor::Latest => i64::MAX,
            Anchor::Before(id) | Anchor::After(id) => id,
        }
    }

    /// Whether an entry lies on the page's side of its anchor and is of
    /// its kind.
    pub fn admits(&self, entry: &TranscriptEntry) -> bool {
        let id = entry.id;
        let placed = match self.anchor {
            Anchor::Latest => true,
            Anchor::Before(b) => id < b,
            Anchor::After(a) => id > a,
        };
        placed && self.kind.is_none_or(|k| k == entry.kind)
    }
}

/// A page of a transcript, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TranscriptSlice {
    /// The entries, oldest first.
    pub entries: Vec<TranscriptEntry>,
    /// More entries lie beyond the page in the direction it was read
    /// (older for [`Anchor::Latest`] and [`Anchor::Before`], newer for
    /// [`Anchor::After`]).
    pub more: bool,
}

/// The bounds of one page as it is filled: at most `limit` items and about
/// `max_bytes` (always at least one item, whatever its size). The one rule
/// every bounded read shares: the transcript here, the approvals, the audit
/// log and the event replay in the store.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: usize,
    max_bytes: usize,
    items: usize,
    bytes: usize,
}

impl Budget {
    /// An empty page of at most `limit` items (at least one) and about
    /// `max_bytes`.
    pub fn new(limit: usize, max_bytes: usize) -> Self {
        Budget {
            limit: limit.max(1),
            max_bytes,
            items: 0,
            bytes: 0,
        }
    }

    /// Whether an item of `size` bytes still fits; if so it is counted.
    pub fn admit(&mut self, size: usize) -> bool {
        let full =
            self.items >= self.limit || (self.items > 0 && self.bytes + size > self.max_bytes);
        if !full {
            self.items += 1;
            self.bytes += size;
        }
        !full
    }
}

/// Fills a page from entries offered in reading order (newest first for
/// [`Anchor::Latest`] and [`Anchor::Before`], oldest first for
/// [`Anchor::After`]), stopping at the page's bounds.
#[derive(Debug)]
pub struct PageFill {
    page: TranscriptPage,
    budget: Budget,
    entries: Vec<TranscriptEntry>,
    more: bool,
}

impl PageFill {
    /// An empty page.
    pub fn new(page: TranscriptPage) -> Self {
        PageFill {
            page,
            budget: Budget::new(page.limit, page.max_bytes),
            entries: Vec::new(),
            more: false,
        }
    }

    /// Takes the next entry in reading order; returns false once the page is
    /// full (the entry offered then is not taken, and marks the page as
    /// having more).
    pub fn offer(&mut self, entry: TranscriptEntry) -> bool {
        if !self.budget.admit(entry.content.len()) {
            self.more = true;
            return false;
        }
        self.entries.push(entry);
        true
    }

    /// The page, oldest first.
    pub fn finish(mut self) -> TranscriptSlice {
        if self.page.newest_first() {
            self.entries.reverse();
        }
        TranscriptSlice {
            entries: self.entries,
            more: self.more,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MessageKind, Role};

    fn entry(id: i64, size: usize) -> TranscriptEntry {
        TranscriptEntry {
            id,
            role: Role::Agent,
            kind: MessageKind::Text,
            content: "x".repeat(size),
            created_at: id,
        }
    }

    fn fill(page: TranscriptPage, ids: impl IntoIterator<Item = (i64, usize)>) -> TranscriptSlice {
        let mut f = PageFill::new(page);
        for (id, size) in ids {
            if !page.admits(&entry(id, 0)) {
                continue;
            }
            if !f.offer(entry(id, size)) {
                break;
            }
        }
        f.finish()
    }

    fn ids(s: &TranscriptSlice) -> Vec<i64> {
        s.entries.iter().map(|e| e.id).collect()
    }

    #[test]
    fn the_latest_page_is_the_newest_entries_oldest_first() {
        let page = TranscriptPage {
            limit: 3,
            ..TranscriptPage::LATEST
        };
        let s = fill(page, (1..=10).rev().map(|id| (id, 1)));
        assert_eq!(ids(&s), [8, 9, 10]);
        assert!(s.more);
    }

    #[test]
    fn a_page_that_holds_everything_has_no_more() {
        let s = fill(TranscriptPage::LATEST, (1..=4).rev().map(|id| (id, 10)));
        assert_eq!(ids(&s), [1, 2, 3, 4]);
        assert!(!s.more);
    }

    #[test]
    fn paging_back_and_forward_starts_past_the_anchor() {
        let before = TranscriptPage {
            anchor: Anchor::Before(5),
            limit: 2,
            ..TranscriptPage::LATEST
        };
        let s = fill(before, (1..=10).rev().map(|id| (id, 1)));
        assert_eq!(ids(&s), [3, 4]);
        assert!(s.more);
        let after = TranscriptPage {
            anchor: Anchor::After(8),
            limit: 5,
            ..TranscriptPage::LATEST
        };
        let s = fill(after, (1..=10).map(|id| (id, 1)));
        assert_eq!(ids(&s), [9, 10]);
        assert!(!s.more);
    }

    #[test]
    fn the_byte_budget_stops_a_page_but_never_empties_it() {
        let page = TranscriptPage {
            max_bytes: 100,
            ..TranscriptPage::LATEST
        };
        // Newest first: 40 + 50 fit, the next 40 would pass 100.
        let s = fill(page, [(5, 40), (4, 50), (3, 40), (2, 1)]);
        assert_eq!(ids(&s), [4, 5]);
        assert!(s.more);
        // One entry bigger than the whole budget is still returned.
        let s = fill(page, [(9, 1000), (8, 1)]);
        assert_eq!(ids(&s), [9]);
        assert!(s.more);
    }

    #[test]
    fn a_kind_page_holds_only_that_kind() {
        let page = TranscriptPage::latest_of(MessageKind::Plan);
        let mut plan = entry(3, 1);
        plan.kind = MessageKind::Plan;
        assert!(page.admits(&plan));
        assert!(!page.admits(&entry(4, 1)), "text is not a plan");
    }

    #[test]
    fn a_zero_limit_still_returns_one_entry() {
        let page = TranscriptPage {
            limit: 0,
            ..TranscriptPage::LATEST
        };
        assert_eq!(ids(&fill(page, [(2, 1), (1, 1)])), [2]);
    }
}

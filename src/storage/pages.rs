//! Lists read in bounded pages, newest first: the approvals and the audit
//! log.
//!
//! Why this exists: an agent decides how many requests and refusals a
//! session makes and how big they are (a request carries its diff, a
//! refusal the path the agent named). A probe made `GET /api/approvals`
//! answer 540 MB and the server hold 1.7 GB to build it. So a list is read
//! as a stream, newest first, and cut at a count and a byte bound; the
//! page says where the next one starts (a keyset: the `before` id).

use futures::{Stream, TryStreamExt};
use intercom_actors::ports::StoreError;
use intercom_actors::transcript::Budget;

use super::backend;

/// The page bounds the transcript's pages have too.
pub use intercom_actors::transcript::{MAX_LIMIT, MAX_PAGE_BYTES};

/// Items in a page when the reader does not say.
pub const DEFAULT_LIMIT: usize = 500;

/// Which page to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Only items older than this key (the previous page's `next`).
    pub before: Option<i64>,
    /// At most this many items.
    pub limit: usize,
    /// At most about this many bytes.
    pub max_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            before: None,
            limit: DEFAULT_LIMIT,
            max_bytes: MAX_PAGE_BYTES,
        }
    }
}

impl Bounds {
    /// The key bound for a query (`key < ?`).
    pub fn before_key(&self) -> i64 {
        self.before.unwrap_or(i64::MAX)
    }
}

/// A page, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// When older items remain: the `before` of the next page.
    pub next: Option<i64>,
}

/// Reads `rows` (newest first) into a page, stopping at its bounds. `take`
/// turns a row into (its key, its size in bytes, the item).
pub(crate) async fn newest_first<R, T, S>(
    rows: S,
    bounds: Bounds,
    op: &'static str,
    take: impl Fn(R) -> Result<(i64, usize, T), StoreError>,
) -> Result<Page<T>, StoreError>
where
    S: Stream<Item = Result<R, sqlx::Error>>,
{
    let mut rows = std::pin::pin!(rows);
    let mut budget = Budget::new(bounds.limit, bounds.max_bytes);
    let mut items = Vec::new();
    let mut last_key = None;
    while let Some(row) = rows.try_next().await.map_err(backend(op))? {
        let (key, size, item) = take(row)?;
        if !budget.admit(size) {
            return Ok(Page {
                items,
                next: last_key,
            });
        }
        last_key = Some(key);
        items.push(item);
    }
    Ok(Page { items, next: None })
}

//! Paged lists over HTTP: `before` and `limit` in the query, a `Link`
//! header (RFC 8288, `rel="prev"`) naming the next, older page.
//!
//! Why this exists: an agent decides how long the approvals list and the
//! audit log grow and how big their items are, so these lists answer a
//! bounded page ([`crate::storage::pages`]) and say where the rest is. The
//! body stays the plain array it was before paging.

use axum::http::HeaderValue;
use axum::http::header::LINK;
use axum::response::Response;

use super::error::ApiError;
use crate::storage::pages::{Bounds, DEFAULT_LIMIT, MAX_LIMIT};

/// The page a query asks for, or what is wrong with it.
pub fn bounds(before: Option<i64>, limit: Option<usize>) -> Result<Bounds, ApiError> {
    if let Some(b) = before.filter(|b| *b < 0) {
        return Err(ApiError::bad_request(format!(
            "before must be an id (0 or more), not {b}"
        )));
    }
    Ok(Bounds {
        before,
        limit: page_limit(limit, DEFAULT_LIMIT)?,
        ..Bounds::default()
    })
}

/// The `limit` a query asks for (`default` when it does not say), or why
/// it is refused: every paged list takes 1 to [`MAX_LIMIT`].
pub fn page_limit(asked: Option<usize>, default: usize) -> Result<usize, ApiError> {
    let limit = asked.unwrap_or(default);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LIMIT}, not {limit}"
        )));
    }
    Ok(limit)
}

/// Which way the page a `Link` names lies.
#[derive(Debug, Clone, Copy)]
pub enum Toward {
    /// Older items: `?before=<key>`, `rel="prev"`.
    Older,
    /// Newer items: `?after=<key>`, `rel="next"`.
    Newer,
}

/// Adds `Link: <path?query&before=key&limit=..>; rel="prev"` (or `after`,
/// `next`) when `key` says more items remain. `query` holds the other
/// parameters, already encoded.
pub fn link(
    response: &mut Response,
    path: &str,
    query: &str,
    toward: Toward,
    key: Option<i64>,
    limit: usize,
) {
    let Some(key) = key else { return };
    let (param, rel) = match toward {
        Toward::Older => ("before", "prev"),
        Toward::Newer => ("after", "next"),
    };
    let sep = if query.is_empty() { "" } else { "&" };
    let link = format!("<{path}?{query}{sep}{param}={key}&limit={limit}>; rel=\"{rel}\"");
    if let Ok(value) = HeaderValue::from_str(&link) {
        response.headers_mut().insert(LINK, value);
    }
}

/// [`link`] to older items.
pub fn link_older(
    response: &mut Response,
    path: &str,
    query: &str,
    next: Option<i64>,
    limit: usize,
) {
    link(response, path, query, Toward::Older, next, limit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[test]
    fn a_limit_out_of_range_says_what_is_allowed() {
        assert_eq!(bounds(None, None).expect("default").limit, DEFAULT_LIMIT);
        assert_eq!(bounds(Some(9), Some(3)).expect("page").before, Some(9));
        assert!(bounds(Some(-1), None).is_err(), "a negative id is refused");
        for bad in [0, MAX_LIMIT + 1] {
            let err = bounds(None, Some(bad)).expect_err("refused");
            assert!(format!("{err:?}").contains("between 1 and 5000"), "{err:?}");
        }
    }

    #[test]
    fn the_link_names_the_older_page_only_when_there_is_one() {
        let mut r = ().into_response();
        link_older(&mut r, "/api/audit", "session=s-1", None, 10);
        assert!(r.headers().get(LINK).is_none());
        link_older(&mut r, "/api/audit", "session=s-1", Some(42), 10);
        assert_eq!(
            r.headers()[LINK],
            "</api/audit?session=s-1&before=42&limit=10>; rel=\"prev\""
        );
    }
}

//! A session's transcript in pages: `GET /api/sessions/{id}/messages`.
//!
//! Why this exists: the agent decides how much a transcript holds, and one
//! answer carrying all of it was measured at 1.8 GB. So the answer is a page
//! ([`intercom_actors::transcript`]): the newest entries by default, at most
//! `limit` of them and about 8 MiB of content, oldest first. When entries
//! lie beyond the page, a `Link` header (RFC 8288) names the next page:
//! `rel="prev"` for older entries (`?before=<id>`), `rel="next"` for newer
//! ones (`?after=<id>`). The body stays a plain array, as before paging.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use intercom_actors::model::{MessageKind, SessionId};
use intercom_actors::transcript::{Anchor, DEFAULT_LIMIT, TranscriptPage};
use serde::Deserialize;

use super::error::{ApiError, ApiPath, ApiQuery};
use super::paging::{self, Toward};
use super::views::MessageView;
use crate::app::App;
use crate::ctl::client::segment;

/// `GET /api/sessions/{id}/messages` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    before: Option<i64>,
    after: Option<i64>,
    limit: Option<usize>,
    kind: Option<String>,
}

impl PageQuery {
    /// The page asked for, or what is wrong with the query.
    fn page(&self) -> Result<TranscriptPage, ApiError> {
        // Ids start at 1: a negative one is a client's mistake, said as
        // the event stream says it (an empty page would read as "no more").
        if let Some((name, id)) = [("before", self.before), ("after", self.after)]
            .into_iter()
            .find_map(|(n, v)| v.filter(|v| *v < 0).map(|v| (n, v)))
        {
            return Err(ApiError::bad_request(format!(
                "{name} must be an entry id (0 or more), not {id}"
            )));
        }
        let anchor = match (self.before, self.after) {
            (None, None) => Anchor::Latest,
            (Some(b), None) => Anchor::Before(b),
            (None, Some(a)) => Anchor::After(a),
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give before or after, not both: before=<id> pages back, after=<id> catches up",
                ));
            }
        };
        let limit = paging::page_limit(self.limit, DEFAULT_LIMIT)?;
        let kind = match self.kind.as_deref() {
            None => None,
            Some(k) => Some(message_kind(k).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "kind must be text, plan, tool, thought or error, not {k:?}"
                ))
            })?),
        };
        Ok(TranscriptPage {
            anchor,
            limit,
            kind,
            ..TranscriptPage::LATEST
        })
    }
}

/// `GET /api/sessions/{id}/messages[?before=<id>|after=<id>][&limit=<n>]`.
pub async fn messages(
    State(app): State<App>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Response, ApiError> {
    let page = query.page()?;
    let session = SessionId(id);
    let slice = app.transcript_page(&session, page).await?;
    // The page beyond this one, in the direction it was read.
    let (toward, beyond) = if page.newest_first() {
        (Toward::Older, slice.entries.first())
    } else {
        (Toward::Newer, slice.entries.last())
    };
    let key = beyond.filter(|_| slice.more).map(|e| e.id);
    let body: Vec<MessageView> = slice.entries.into_iter().map(MessageView::from).collect();
    let mut response = Json(body).into_response();
    let path = format!("/api/sessions/{}/messages", segment(&session.0));
    let kind = page
        .kind
        .map(|k| format!("kind={}", k.as_str()))
        .unwrap_or_default();
    paging::link(&mut response, &path, &kind, toward, key, page.limit);
    Ok(response)
}

/// A message kind by its name.
fn message_kind(name: &str) -> Option<MessageKind> {
    [
        MessageKind::Text,
        MessageKind::Plan,
        MessageKind::Tool,
        MessageKind::Thought,
        MessageKind::Error,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercom_actors::transcript::MAX_LIMIT;

    fn query(before: Option<i64>, after: Option<i64>, limit: Option<usize>) -> PageQuery {
        PageQuery {
            before,
            after,
            limit,
            kind: None,
        }
    }

    #[test]
    fn the_query_names_the_page() {
        let p = query(None, None, None).page().expect("page");
        assert_eq!(p, TranscriptPage::LATEST);
        let p = query(Some(7), None, Some(10)).page().expect("page");
        assert_eq!((p.anchor, p.limit), (Anchor::Before(7), 10));
        let p = query(None, Some(3), None).page().expect("page");
        assert_eq!(p.anchor, Anchor::After(3));
        let plan = PageQuery {
            kind: Some("plan".into()),
            ..query(None, None, Some(1))
        };
        let p = plan.page().expect("page");
        assert_eq!(p, TranscriptPage::latest_of(MessageKind::Plan));
    }

    #[test]
    fn a_bad_query_says_what_is_allowed() {
        for (q, says) in [
            (query(Some(1), Some(2), None), "not both"),
            (query(Some(-1), None, None), "before must be an entry id"),
            (query(None, Some(-5), None), "after must be an entry id"),
            (query(None, None, Some(0)), "between 1 and 5000"),
            (query(None, None, Some(MAX_LIMIT + 1)), "between 1 and 5000"),
            (
                PageQuery {
                    kind: Some("chat".into()),
                    ..query(None, None, None)
                },
                "kind must be text, plan",
            ),
        ] {
            let err = q.page().expect_err("refused");
            assert!(format!("{err:?}").contains(says), "{err:?}");
        }
    }
}

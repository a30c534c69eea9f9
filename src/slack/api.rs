//! The Slack Web API through slack-morphism: the core's [`SlackApi`] port.
//!
//! Why this exists: the gateway only knows [`SlackApi`]; this file turns its
//! calls into slack-morphism requests and slack-morphism's errors into the
//! three cases the gateway retries differently (rate limited, transient,
//! permanent). It also opens Socket Mode connections (`apps.connections.open`
//! with the app token) and asks who the bot is (`auth.test`).
//!
//! The connector accepts `http://` as well as `https://` base URLs so that
//! `[slack] api_url` can point at a loopback emulator.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use slack_morphism::errors::*;
use slack_morphism::prelude::*;

use intercom_actors::slack_port::{MessageBody, SlackApi, SlackApiError, Snippet};

use super::SlackError;

/// Slack's own Web API base.
pub const DEFAULT_API_URL: &str = "https://slack.com/api";

/// Used when a 429 carries no `Retry-After`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest a 429's `Retry-After` pauses a bucket. Slack's own are
/// seconds; a probe's single `Retry-After: 3600` silenced a channel, new
/// requests' buttons included, for an hour. Past this the call is simply
/// tried again (and paused again if Slack still says so).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long one Web API call may take before it counts as a network
/// failure and is retried. Without it, one call that never answered (a
/// half-open connection) held its session's thread, buttons included,
/// until a restart.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `call`, or a transient failure once it has taken [`CALL_TIMEOUT`].
async fn answered<T>(
    call: impl std::future::Future<Output = Result<T, SlackApiError>>,
) -> Result<T, SlackApiError> {
    answered_within(CALL_TIMEOUT, call).await
}

/// `call`, or a transient failure once it has taken `limit`.
async fn answered_within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, SlackApiError>>,
) -> Result<T, SlackApiError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(SlackApiError::Transient(format!(
            "Slack did not answer within {} ms",
            limit.as_millis()
        )))
    })
}

/// A slack-morphism client with the bot and app tokens.
pub struct MorphismApi {
    client: SlackHyperClient,
    bot: SlackApiToken,
    app: SlackApiToken,
    /// Where `response_url`s may point: Slack's hooks host, or the origin
    /// of `[slack] api_url` (an emulator).
    api_origin: Option<url::Origin>,
}

/// Who the bot is (`auth.test`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's user id (its own messages carry it).
    pub user_id: String,
    /// The bot id, when Slack reports one.
    pub bot_id: Option<String>,
}

impl MorphismApi {
    /// Builds the client. `api_url` defaults to Slack's; a trailing `/` is ignored.
    pub fn new(
        api_url: Option<&str>,
        bot_token: &str,
        app_token: &str,
    ) -> Result<Self, SlackError> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| SlackError::Tls(e.to_string()))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        let base = api_url
            .map(|u| u.trim_end_matches('/'))
            .filter(|u| !u.is_empty())
            .unwrap_or(DEFAULT_API_URL);
        let connector = SlackClientHyperConnector::with_connector(https).with_slack_api_url(base);
        Ok(MorphismApi {
            client: SlackClient::new(connector),
            bot: SlackApiToken::new(SlackApiTokenValue(bot_token.to_owned())),
            app: SlackApiToken::new(SlackApiTokenValue(app_token.to_owned())),
            api_origin: url::Url::parse(base).ok().map(|u| u.origin()),
        })
    }

    /// A `response_url` the server may post to: on Slack's hooks host over
    /// https, or on `[slack] api_url`'s origin. It arrives inside a Socket
    /// Mode payload, which only Slack sends, but the server still posts
    /// nowhere else (no request to an address a payload names).
    fn response_url(&self, url: &str) -> Result<url::Url, SlackApiError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| SlackApiError::Permanent(format!("unreadable response_url: {e}")))?;
        let slack = parsed.scheme() == "https" && parsed.host_str() == Some(SLACK_HOOKS_HOST);
        if slack || self.api_origin.as_ref() == Some(&parsed.origin()) {
            Ok(parsed)
        } else {
            Err(SlackApiError::Permanent(
                "a response_url that is not Slack's".into(),
            ))
        }
    }

    /// `apps.connections.open`: a fresh Socket Mode URL.
    pub async fn open_socket_url(&self) -> Result<String, SlackApiError> {
        answered(async {
            let session = self.client.open_session(&self.app);
            let res = session
                .apps_connections_open(&SlackApiAppsConnectionOpenRequest::new())
                .await
                .map_err(classify)?;
            Ok(res.url.0.to_string())
        })
        .await
    }

    /// `auth.test` with the bot token.
    pub async fn identity(&self) -> Result<BotIdentity, SlackApiError> {
        answered(async {
            let session = self.client.open_session(&self.bot);
            let res = session.auth_test().await.map_err(classify)?;
            Ok(BotIdentity {
                user_id: res.user_id.0,
                bot_id: res.bot_id.map(|b| b.0),
            })
        })
        .await
    }

    fn session(&self) -> SlackClientSession<'_, SlackClientHyperHttpsConnector> {
        self.client.open_session(&self.bot)
    }
}

/// The host of Slack's `response_url`s.
const SLACK_HOOKS_HOST: &str = "hooks.slack.com";

/// Turns a JSON body into slack-morphism content; invalid blocks are permanent.
fn content(body: &MessageBody) -> Result<SlackMessageContent, SlackApiError> {
    let content = SlackMessageContent::new().with_text(body.text.clone());
    if body.blocks.is_empty() {
        return Ok(content);
    }
    let blocks: Vec<SlackBlock> = serde_json::from_value(Value::Array(body.blocks.clone()))
        .map_err(|e| SlackApiError::Permanent(format!("invalid Block Kit blocks: {e}")))?;
    Ok(content.with_blocks(blocks))
}

/// Slack's refusals that last only until someone acts (invites the bot,
/// unarchives the channel, replaces the token, adds a scope): the message
/// is kept and tried again, never dropped.
const BLOCKED_CODES: [&str; 13] = [
    "not_in_channel",
    "channel_not_found",
    "is_archived",
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "missing_scope",
    "no_permission",
    "access_denied",
    "ekm_access_denied",
    "team_access_not_granted",
];

/// Sorts slack-morphism's errors into what the gateway does about them.
pub fn classify(err: SlackClientError) -> SlackApiError {
    match err {
        SlackClientError::RateLimitError(e) => SlackApiError::RateLimited {
            retry_after: e
                .retry_after
                .unwrap_or(DEFAULT_RETRY_AFTER)
                .min(MAX_RETRY_AFTER),
        },
        SlackClientError::ApiError(e) => match e.code.as_str() {
            "ratelimited" | "rate_limited" => SlackApiError::RateLimited {
                retry_after: DEFAULT_RETRY_AFTER,
            },
            "internal_error" | "fatal_error" | "service_unavailable" | "request_timeout" => {
                SlackApiError::Transient(e.code)
            }
            code if BLOCKED_CODES.contains(&code) => SlackApiError::Blocked(e.code),
            _ => SlackApiError::Permanent(e.code),
        },
        SlackClientError::HttpError(e) => {
            let status = e.status_code.as_u16();
            if status >= 500 || status == 408 {
                SlackApiError::Transient(format!("HTTP {status}"))
            } else if status == 401 || status == 403 {
                SlackApiError::Blocked(format!("HTTP {status}"))
            } else {
                SlackApiError::Permanent(format!("HTTP {status}"))
            }
        }
        // An answer that is not Slack's JSON (a proxy's or a captive
        // portal's page) says nothing of whether Slack took the call: tried
        // again, as a 5xx is. It was taken as a refusal and the message lost.
        SlackClientError::HttpProtocolError(_)
        | SlackClientError::EndOfStream(_)
        | SlackClientError::SystemError(_)
        | SlackClientError::ProtocolError(_) => SlackApiError::Transient(err.to_string()),
        SlackClientError::SocketModeProtocolError(_) => SlackApiError::Permanent(err.to_string()),
    }
}

/// Notes what became of a message call: refused for good (counted, and a
/// refused bot token shown on `/healthz`), or taken. A revoked token made
/// every post fail while `/healthz` said Slack was connected.
fn observed<T>(result: Result<T, SlackApiError>) -> Result<T, SlackApiError> {
    match &result {
        Ok(_) => super::dropped::note_taken(),
        Err(SlackApiError::Permanent(code)) => super::dropped::note_refused(code),
        Err(SlackApiError::Blocked(code)) => super::dropped::note_blocked(code),
        Err(_) => {}
    }
    result
}

/// Treats an API error code as success (idempotent reactions).
fn ok_if(code: &str, r: Result<(), SlackClientError>) -> Result<(), SlackApiError> {
    match r {
        Err(SlackClientError::ApiError(e)) if e.code == code => Ok(()),
        other => other.map_err(classify),
    }
}

fn ts(t: Option<&str>) -> Option<SlackTs> {
    t.map(|t| SlackTs(t.to_owned()))
}

#[async_trait]
impl SlackApi for MorphismApi {
    async fn post_message(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        body: &MessageBody,
    ) -> Result<String, SlackApiError> {
        observed(
            answered(async {
                let req = SlackApiChatPostMessageRequest::new(
                    SlackChannelId(channel.to_owned()),
                    content(body)?,
                )
                .opt_thread_ts(ts(thread_ts));
                let res = self
                    .session()
                    .chat_post_message(&req)
                    .await
                    .map_err(classify)?;
                Ok(res.ts.0)
            })
            .await,
        )
    }

    async fn update_message(
        &self,
        channel: &str,
        ts: &str,
        body: &MessageBody,
    ) -> Result<(), SlackApiError> {
        observed(
            answered(async {
                let req = SlackApiChatUpdateRequest::new(
                    SlackChannelId(channel.to_owned()),
                    content(body)?,
                    SlackTs(ts.to_owned()),
                );
                self.session()
                    .chat_update(&req)
                    .await
                    .map(|_| ())
                    .map_err(classify)
            })
            .await,
        )
    }

    async fn add_reaction(&self, channel: &str, ts: &str, name: &str) -> Result<(), SlackApiError> {
        answered(async {
            let req = SlackApiReactionsAddRequest::new(
                SlackChannelId(channel.to_owned()),
                SlackReactionName(name.to_owned()),
                SlackTs(ts.to_owned()),
            );
            ok_if(
                "already_reacted",
                self.session().reactions_add(&req).await.map(|_| ()),
            )
        })
        .await
    }

    async fn remove_reaction(
        &self,
        channel: &str,
        ts: &str,
        name: &str,
    ) -> Result<(), SlackApiError> {
        answered(async {
            let req = SlackApiReactionsRemoveRequest::new(SlackReactionName(name.to_owned()))
                .with_channel(SlackChannelId(channel.to_owned()))
                .with_timestamp(SlackTs(ts.to_owned()));
            ok_if(
                "no_reaction",
                self.session().reactions_remove(&req).await.map(|_| ()),
            )
        })
        .await
    }

    async fn upload_snippet(
        &self,
        channel: &str,
        thread_ts: Option<&str>,
        snippet: &Snippet,
    ) -> Result<(), SlackApiError> {
        observed(
            answered(async {
                let session = self.session();
                let bytes = snippet.content.as_bytes().to_vec();
                let url = session
                    .get_upload_url_external(
                        &SlackApiFilesGetUploadUrlExternalRequest::new(
                            snippet.filename.clone(),
                            bytes.len(),
                        )
                        .with_snippet_type(SlackFileSnippetType("diff".to_owned())),
                    )
                    .await
                    .map_err(classify)?;
                session
                    .files_upload_via_url(&SlackApiFilesUploadViaUrlRequest::new(
                        url.upload_url,
                        bytes,
                        "text/plain".to_owned(),
                    ))
                    .await
                    .map_err(classify)?;
                let file =
                    SlackApiFilesComplete::new(url.file_id).with_title(snippet.title.clone());
                session
                    .files_complete_upload_external(
                        &SlackApiFilesCompleteUploadExternalRequest::new(vec![file])
                            .with_channel_id(SlackChannelId(channel.to_owned()))
                            .opt_thread_ts(ts(thread_ts)),
                    )
                    .await
                    .map(|_| ())
                    .map_err(classify)
            })
            .await,
        )
    }

    async fn post_ephemeral(
        &self,
        channel: &str,
        user: &str,
        thread_ts: Option<&str>,
        body: &MessageBody,
    ) -> Result<(), SlackApiError> {
        observed(
            answered(async {
                let req = SlackApiChatPostEphemeralRequest::new(
                    SlackChannelId(channel.to_owned()),
                    SlackUserId(user.to_owned()),
                    content(body)?,
                )
                .opt_thread_ts(ts(thread_ts));
                self.session()
                    .chat_post_ephemeral(&req)
                    .await
                    .map(|_| ())
                    .map_err(classify)
            })
            .await,
        )
    }

    async fn respond(&self, response_url: &str, body: &MessageBody) -> Result<(), SlackApiError> {
        let url = SlackResponseUrl(self.response_url(response_url)?);
        answered(async {
            let req = SlackApiPostWebhookMessageRequest::new(content(body)?);
            self.client
                .respond_to_event(&url, &req)
                .await
                .map(|_| ())
                .map_err(classify)
        })
        .await
    }

    async fn open_view(&self, trigger_id: &str, view: &Value) -> Result<(), SlackApiError> {
        answered(async {
            let view: SlackView = serde_json::from_value(view.clone())
                .map_err(|e| SlackApiError::Permanent(format!("invalid modal view: {e}")))?;
            let req = SlackApiViewsOpenRequest::new(SlackTriggerId(trigger_id.to_owned()), view);
            self.session()
                .views_open(&req)
                .await
                .map(|_| ())
                .map_err(classify)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_for_retrying() {
        let rate = SlackClientError::RateLimitError(
            SlackRateLimitError::new().with_retry_after(Duration::from_secs(3)),
        );
        assert_eq!(
            classify(rate),
            SlackApiError::RateLimited {
                retry_after: Duration::from_secs(3)
            }
        );
        let api = |code: &str| SlackClientError::ApiError(SlackClientApiError::new(code.into()));
        // Until someone acts (a probe's request lost its buttons for good
        // to one `not_in_channel`); a refusal of the message itself is
        // for good.
        for code in ["channel_not_found", "not_in_channel", "invalid_auth"] {
            assert_eq!(classify(api(code)), SlackApiError::Blocked(code.into()));
        }
        assert!(matches!(
            classify(api("msg_too_long")),
            SlackApiError::Permanent(_)
        ));
        assert!(matches!(
            classify(api("internal_error")),
            SlackApiError::Transient(_)
        ));
    }

    #[test]
    fn a_response_url_is_posted_to_only_on_slack_or_the_configured_api() {
        let api = MorphismApi::new(Some("http://127.0.0.1:1234/api/"), "xoxb-1", "xapp-1")
            .expect("client");
        for ok in [
            "https://hooks.slack.com/commands/T1/123/abc",
            "http://127.0.0.1:1234/respond/trig-1",
        ] {
            assert!(api.response_url(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://hooks.slack.com/commands/T1/123/abc",
            "https://hooks.slack.com.evil.example/x",
            "http://127.0.0.1:9999/respond/trig-1",
            "http://169.254.169.254/latest/meta-data",
            "not a url",
        ] {
            assert!(
                matches!(api.response_url(refused), Err(SlackApiError::Permanent(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_long_retry_after_is_capped_and_a_garbled_answer_is_retried() {
        let rate = SlackClientError::RateLimitError(
            SlackRateLimitError::new().with_retry_after(Duration::from_secs(3600)),
        );
        assert_eq!(
            classify(rate),
            SlackApiError::RateLimited {
                retry_after: MAX_RETRY_AFTER
            }
        );
        let garbled = SlackClientError::ProtocolError(SlackClientProtocolError::new(
            serde_json::from_str::<Value>("<html>not json").expect_err("not json"),
        ));
        assert!(matches!(classify(garbled), SlackApiError::Transient(_)));
    }

    #[tokio::test]
    async fn a_call_that_never_answers_is_a_transient_failure() {
        let never = std::future::pending::<Result<(), SlackApiError>>();
        let got = answered_within(Duration::from_millis(20), never).await;
        assert!(
            matches!(&got, Err(SlackApiError::Transient(e)) if e.contains("did not answer")),
            "{got:?}"
        );
    }

    #[test]
    fn the_client_builds_for_https_and_http_base_urls() {
        assert!(MorphismApi::new(None, "xoxb-x", "xapp-x").is_ok());
        assert!(MorphismApi::new(Some("http://127.0.0.1:9/api/"), "xoxb-x", "xapp-x").is_ok());
    }

    #[test]
    fn text_only_bodies_have_no_blocks() {
        let c = content(&MessageBody::text("hi")).expect("content");
        assert_eq!(c.text.as_deref(), Some("hi"));
        assert!(c.blocks.is_none());
        let rich = MessageBody {
            text: "x".into(),
            blocks: vec![serde_json::json!({"type": "divider"})],
        };
        assert_eq!(
            content(&rich).expect("content").blocks.map(|b| b.len()),
            Some(1)
        );
    }
}

//! The API token: where it comes from, and the bearer check on `/api`.
//!
//! The token is `AGENT_INTERCOM_TOKEN` when set, else the content of
//! `api-token` in the database's directory, generated at first start (32
//! random bytes as hex, file mode 0600). The comparison is constant-time and
//! the token is never logged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// Environment variable that overrides the token file.
pub const TOKEN_ENV: &str = "AGENT_INTERCOM_TOKEN";
/// Name of the token file, next to the database.
pub const TOKEN_FILE_NAME: &str = "api-token";

/// The bearer token every `/api` call must present.
#[derive(Clone)]
pub struct ApiToken(String);

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

impl ApiToken {
    /// Wraps a token (trimmed).
    pub fn new(token: &str) -> Self {
        ApiToken(token.trim().to_owned())
    }

    /// The token text (to hand to a client; never log it).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison with a presented token.
    pub fn matches(&self, presented: &str) -> bool {
        ct_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

/// Where the token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `AGENT_INTERCOM_TOKEN`.
    Env,
    /// An existing token file.
    File(PathBuf),
    /// A token file generated just now.
    Generated(PathBuf),
}

/// The fewest characters an operator-chosen API token may have (the
/// generated one has 64). Every wrong guess is answered at once: a probe
/// found a 4-digit token in 4.5 s. MCP workspace tokens have the same floor.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Why the token could not be read or created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token given is too short to withstand guessing.
    #[error(
        "the API token from {origin} is {len} characters; it must have at least {MIN_TOKEN_CHARS} (a short one is guessed in seconds). Set a longer one (e.g. `openssl rand -hex 32`), or remove it to have the server generate {TOKEN_FILE_NAME}"
    )]
    TooShort {
        /// Where it came from: the variable or the file.
        origin: String,
        /// Its length in characters.
        len: usize,
    },
    /// Reading or writing the token file failed.
    #[error("cannot {action} API token file {}: {source}; set {TOKEN_ENV} or fix the file", .path.display())]
    Io {
        /// read / create.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The token file for a database at `database`: `api-token` beside it.
pub fn token_path(database: &Path) -> PathBuf {
    database.parent().map_or_else(
        || PathBuf::from(TOKEN_FILE_NAME),
        |d| d.join(TOKEN_FILE_NAME),
    )
}

/// Reads a token file; `None` when it does not exist or is empty.
pub fn read_token_file(path: &Path) -> Result<Option<String>, TokenError> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenError::Io {
            action: "read",
            path: path.to_owned(),
            source,
        }),
    }
}

/// The token from `env_value` (the value of [`TOKEN_ENV`]) when non-empty,
/// else from the file at `path`, generating the file when missing.
pub fn load_or_create(
    env_value: Option<String>,
    path: &Path,
) -> Result<(ApiToken, TokenSource), TokenError> {
    if let Some(value) = env_value.filter(|v| !v.trim().is_empty()) {
        long_enough(&value, TOKEN_ENV)?;
        return Ok((ApiToken::new(&value), TokenSource::Env));
    }
    if let Some(existing) = read_token_file(path)? {
        long_enough(&existing, &path.display().to_string())?;
        warn_if_readable_by_others(path);
        return Ok((ApiToken::new(&existing), TokenSource::File(path.to_owned())));
    }
    let token = generate()?;
    match write_private(path, &token) {
        Ok(()) => Ok((
            ApiToken::new(&token),
            TokenSource::Generated(path.to_owned()),
        )),
        // Someone else created it meanwhile (complete: see write_private): use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read_token_file(path)? {
            Some(existing) => Ok((ApiToken::new(&existing), TokenSource::File(path.to_owned()))),
            None => Err(TokenError::Io {
                action: "read",
                path: path.to_owned(),
                source: std::io::Error::other(
                    "the token file is empty; delete it to generate a new token",
                ),
            }),
        },
        Err(source) => Err(TokenError::Io {
            action: "create",
            path: path.to_owned(),
            source,
        }),
    }
}

/// 32 random bytes from the OS CSPRNG as 64 hex digits (no weaker fallback).
fn generate() -> Result<String, TokenError> {
    let mut bytes = [0u8; 32];
    intercom_actors::ids::fill(&mut bytes).map_err(|e| TokenError::Io {
        action: "generate",
        path: PathBuf::from(TOKEN_FILE_NAME),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Creates the token file atomically: the token is written (mode 0600,
/// `O_EXCL`) to a temporary name and hard-linked into place, so the file
/// appears complete or not at all (a concurrent reader never sees it empty),
/// and an existing file is never replaced.
fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{TOKEN_FILE_NAME}.{:016x}.tmp",
        intercom_actors::ids::random_u64()
    ));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let written = opts.open(&tmp).and_then(|mut file| {
        file.write_all(format!("{token}\n").as_bytes())?;
        file.sync_all()
    });
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    linked
}

/// Refuses a token shorter than [`MIN_TOKEN_CHARS`] (from `source`).
fn long_enough(token: &str, source: &str) -> Result<(), TokenError> {
    let len = token.trim().chars().count();
    if len < MIN_TOKEN_CHARS {
        return Err(TokenError::TooShort {
            origin: source.to_owned(),
            len,
        });
    }
    Ok(())
}

/// Wrong tokens presented since the server started (API and console
/// login), logged on the first and every hundredth: an operator should
/// learn that something is guessing.
static WRONG_TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts (and now and then logs) a wrong token presented to `what`.
pub fn wrong_token(what: &str) {
    let n = WRONG_TOKENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if n == 1 || n.is_multiple_of(100) {
        tracing::warn!(
            wrong_tokens = n,
            "a wrong API token was presented to {what} ({n} since the server started); if that is not you, something on this machine is guessing"
        );
    }
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(file = %path.display(), "the API token file is readable by other users; chmod 600 it");
        }
    }
}

/// Middleware: refuses `/api` calls without the right bearer token.
pub async fn require_token(
    State(token): State<Arc<ApiToken>>,
    request: Request,
    next: Next,
) -> Response {
    match bearer(&request) {
        Some(presented) if token.matches(presented) => next.run(request).await,
        Some(_) => {
            wrong_token("the API");
            refuse(ApiError::Unauthorized(format!(
                "wrong API token: use {TOKEN_ENV} if the server was started with it, else the content of {TOKEN_FILE_NAME} in the database's directory (data/{TOKEN_FILE_NAME} by default)"
            )))
        }
        None => refuse(ApiError::Unauthorized(format!(
            "missing API token: send Authorization: Bearer <token> (the token is in {TOKEN_ENV} or data/{TOKEN_FILE_NAME})"
        ))),
    }
}

/// A refusal that also ends the connection, and says so. The request's body
/// is never read (an unauthenticated client does not get to make the server
/// read what it sends), so hyper cannot keep the connection; without
/// `Connection: close` a keep-alive client would reuse it and see its next
/// request fail as a dropped connection instead of getting an answer.
fn refuse(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn bearer(request: &Request) -> Option<&str> {
    bearer_in(request.headers())
}

/// True when `headers` carry `token` as `Authorization: Bearer`.
pub fn carries(headers: &HeaderMap, token: &ApiToken) -> bool {
    bearer_in(headers).is_some_and(|presented| token.matches(presented))
}

fn bearer_in(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_compares_whole_strings() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn env_wins_then_file_then_generated() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("data").join(TOKEN_FILE_NAME);
        let (t, src) = load_or_create(Some("from-env-0123456789".into()), &path).expect("env");
        assert_eq!((t.expose(), src), ("from-env-0123456789", TokenSource::Env));
        assert!(!path.exists());

        let (generated, src) = load_or_create(Some("  ".into()), &path).expect("generate");
        assert_eq!(src, TokenSource::Generated(path.clone()));
        assert_eq!(generated.expose().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, src) = load_or_create(None, &path).expect("read");
        assert_eq!(src, TokenSource::File(path.clone()));
        assert_eq!(again.expose(), generated.expose());
        assert!(format!("{again:?}").contains("redacted"));
    }

    #[test]
    fn a_short_token_is_refused_wherever_it_comes_from() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(TOKEN_FILE_NAME);
        let err = load_or_create(Some("7391".into()), &path).expect_err("short env");
        let text = err.to_string();
        assert!(
            text.contains("AGENT_INTERCOM_TOKEN is 4 characters") && text.contains("at least 16"),
            "{text}"
        );
        assert!(!path.exists(), "nothing generated in its place");
        std::fs::write(&path, "hunter2\n").expect("a short file");
        let err = load_or_create(None, &path).expect_err("short file");
        assert!(err.to_string().contains("is 7 characters"), "{err}");
        // Sixteen is enough.
        let (t, _) = load_or_create(Some("0123456789abcdef".into()), &path).expect("16");
        assert_eq!(t.expose(), "0123456789abcdef");
    }

    #[test]
    fn token_file_lives_beside_the_database() {
        assert_eq!(
            token_path(Path::new("/x/data/agent-intercom.db")),
            PathBuf::from("/x/data/api-token")
        );
    }
}

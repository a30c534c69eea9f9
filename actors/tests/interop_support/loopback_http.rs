//! The sliver of HTTP/1.1 the fake model APIs speak: a loopback listener
//! that records every request, one request per connection
//! (`Connection: close`), a `Content-Length` body, an answer written whole or
//! streamed by the caller. Shared by `fake_anthropic` and `fake_gemini` so
//! neither grows its own server or parser.

use std::future::Future;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every request a fake received, as (path, JSON body or null).
type Log = Arc<Mutex<Vec<(String, Value)>>>;

/// One request as the fake's answer sees it.
pub struct Request {
    /// The connection's number, counted from 1.
    pub n: u64,
    pub method: String,
    pub path: String,
    /// The body as JSON (null when it is not JSON).
    pub body: Value,
}

/// A fake's listener on an ephemeral loopback port: reads one request per
/// connection, records it, and hands it to the fake's answer. Stops when
/// dropped.
pub struct Listening {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    log: Log,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listening {
    /// Listens; `name` labels a failed connection on stderr.
    pub async fn start<A, F>(name: &'static str, answer: A) -> Listening
    where
        A: Fn(TcpStream, Request) -> F + Send + Sync + 'static,
        F: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let log: Log = Arc::default();
        let answer = Arc::new(answer);
        let task = tokio::spawn({
            let log = log.clone();
            async move {
                let mut n = 0u64;
                while let Ok((stream, _)) = listener.accept().await {
                    n += 1;
                    let (answer, log) = (answer.clone(), log.clone());
                    tokio::spawn(async move {
                        if let Err(e) = serve(stream, n, answer.as_ref(), &log).await {
                            eprintln!("{name}: connection {n}: {e}");
                        }
                    });
                }
            }
        });
        Listening { url, log, task }
    }

    /// Every request so far as (path, body).
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.log.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

async fn serve<A, F>(mut stream: TcpStream, n: u64, answer: &A, log: &Log) -> std::io::Result<()>
where
    A: Fn(TcpStream, Request) -> F,
    F: Future<Output = std::io::Result<()>>,
{
    let Some((method, path, body)) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Ok(mut l) = log.lock() {
        l.push((path.clone(), body.clone()));
    }
    answer(
        stream,
        Request {
            n,
            method,
            path,
            body,
        },
    )
    .await
}

/// Reads one request: (method, path, body). `None` when the peer closed.
pub async fn read_request(
    stream: &mut TcpStream,
) -> std::io::Result<Option<(String, String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    Ok(Some((method, path, body)))
}

/// Writes a whole answer and closes the connection.
pub async fn respond(
    stream: &mut TcpStream,
    status: &str,
    kind: &str,
    body: &str,
) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await
}

/// Writes the head of a Server-Sent Events answer; the caller streams the
/// frames and then shuts the stream down.
pub async fn start_sse(stream: &mut TcpStream) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await
}

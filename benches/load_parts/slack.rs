//! The Slack operator: the server's Slack edge against the emulator in
//! `tests/emulator`, through a proxy that notes when each request's buttons
//! were posted, and an operator that clicks them.

use super::*;

/// A permission message the proxy saw the emulator accept.
pub(super) struct Posted {
    seen: Instant,
    msg: emulator::Msg,
}

#[derive(Clone)]
pub(super) struct Proxy {
    client: HttpClient,
    upstream: String,
    posted: mpsc::UnboundedSender<Posted>,
}

/// Forwards a Web API call to the emulator; reports permission posts.
pub(super) async fn forward(State(p): State<Proxy>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |x| x.as_str())
        .to_owned();
    let mut up = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{pq}", p.upstream));
    for (k, v) in &parts.headers {
        if k != header::HOST {
            up = up.header(k, v);
        }
    }
    let Ok(up) = up.body(Body::from(body.clone())) else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let Ok(resp) = p.client.request(up).await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let (mut rparts, rbody) = resp.into_parts();
    let Ok(rbytes) = axum::body::to_bytes(Body::new(rbody), usize::MAX).await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    if parts.uri.path().ends_with("/chat.postMessage")
        && body.windows(7).any(|w| w == b"decide:")
        && let (Ok(sent), Ok(answer)) = (
            serde_json::from_slice::<Value>(&body),
            serde_json::from_slice::<Value>(&rbytes),
        )
        && answer["ok"] == true
    {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let _ = p.posted.send(Posted {
            seen: Instant::now(),
            msg: emulator::Msg {
                channel: s(&sent["channel"]),
                ts: s(&answer["ts"]),
                thread_ts: sent["thread_ts"].as_str().map(str::to_owned),
                user: "UBOT".into(),
                text: s(&sent["text"]),
                blocks: sent["blocks"].as_array().cloned().unwrap_or_default(),
                reactions: vec![],
                updates: 0,
                file: None,
            },
        });
    }
    rparts.headers.remove(header::TRANSFER_ENCODING);
    rparts.headers.remove(header::CONNECTION);
    Response::from_parts(rparts, Body::from(rbytes))
}

/// The server side of a Slack bench run: the registry (one workspace bound
/// to [`CHANNEL`]), a SQLite store, the supervisor and the Slack edge,
/// connected over Socket Mode to the emulator whose Web API is `api_url`.
pub(super) struct SlackEdge {
    pub(super) sup: ActorRef<SupervisorMsg>,
    pub(super) registry: ActorRef<RegistryMsg>,
    pub(super) store: Arc<SqliteStore>,
    pub(super) handle: SlackHandle,
}

pub(super) async fn slack_edge(
    env: &Env,
    obs: &Arc<Observed>,
    db: &str,
    api_url: String,
    pacing: PacingPolicy,
) -> SlackEdge {
    let map = WorkspaceMap {
        workspace_root: env.dir.clone(),
        workspaces: vec![WorkspaceEntry {
            id: "ws".into(),
            path: env.workspace.clone(),
            channel_id: CHANNEL.into(),
            label: None,
            default_agent: None,
        }],
        agents: vec![env.profile.clone()],
        default_agent: Some(env.profile.id.clone()),
    };
    let (registry, _) = Actor::spawn(None, WorkspaceRegistry, map)
        .await
        .expect("registry");
    let store = Arc::new(SqliteStore::open(&env.dir.join(db)).await.expect("store"));
    let (slack_sink, events) = slack::event_channel();
    let tracker: Arc<dyn OperatorSink> = Arc::new(BenchSink {
        obs: obs.clone(),
        answer: false,
    });
    let sup = supervisor(
        env,
        store.clone(),
        Arc::new(FanOut(vec![slack_sink, tracker])),
    )
    .await;
    let opts = SlackOptions {
        tokens: SlackTokens {
            bot: "xoxb-bench".into(),
            app: "xapp-bench".into(),
        },
        api_url: Some(api_url),
        operators: vec![OWNER.to_owned()],
        supervisor: sup.clone(),
        registry: registry.clone().into(),
        root: None,
        store: store.clone(),
        outbox: store.clone(),
        tuning: SlackTuning {
            pacing,
            ..SlackTuning::default()
        },
    };
    let handle = slack::spawn_slack(opts, events).await.expect("spawn_slack");
    let mut status = handle.status();
    tokio::time::timeout(
        Duration::from_secs(20),
        status.wait_for(|s| s == ConnectionState::Connected),
    )
    .await
    .expect("Socket Mode connects");
    SlackEdge {
        sup,
        registry,
        store,
        handle,
    }
}

pub(super) async fn rig_slack(env: &Env, obs: &Arc<Observed>, bench: &Handle) -> Rig {
    let (emu, proxy_url, posted_rx, proxy_task) = bench
        .spawn(async move {
            let emu = emulator::Emulator::start().await;
            let upstream = emu
                .api_url
                .trim_end_matches('/')
                .trim_end_matches("/api")
                .to_owned();
            let (tx, rx) = mpsc::unbounded_channel();
            let proxy = Proxy {
                client: http_client(),
                upstream,
                posted: tx,
            };
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind proxy");
            let url = format!("http://{}/api/", listener.local_addr().expect("addr"));
            let app = axum::Router::new().fallback(forward).with_state(proxy);
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            (emu, url, rx, task)
        })
        .await
        .expect("emulator");
    // The plain emulator has no rate limits: measure the server, not Slack's pace.
    let SlackEdge {
        sup,
        registry,
        store,
        handle,
    } = slack_edge(env, obs, "slack.db", proxy_url, PacingPolicy::unpaced()).await;
    // The operator: clicks allow-once on every permission message it sees.
    let mut posted_rx = posted_rx;
    let (obs2, emu2) = (obs.clone(), emu.clone());
    let operator = bench.spawn(async move {
        while let Some(Posted { seen, msg }) = posted_rx.recv().await {
            let button = msg.button("allow-once").or_else(|| {
                msg.buttons().into_iter().find(|b| {
                    b["action_id"]
                        .as_str()
                        .is_some_and(|a| a.starts_with("decide:"))
                })
            });
            match button {
                Some(b) => {
                    if let Some((global, _)) = b["value"].as_str().and_then(|v| v.rsplit_once('|'))
                    {
                        obs2.saw(global, seen);
                    }
                    emu2.click(OWNER, &msg, &b);
                    obs2.delay(seen.elapsed());
                }
                None => obs2.error(format!("no decision button in {}", msg.all_text())),
            }
        }
    });
    Rig::Slack {
        sup,
        registry,
        store,
        handle: Some(handle),
        emu,
        bench_tasks: vec![proxy_task, operator],
    }
}

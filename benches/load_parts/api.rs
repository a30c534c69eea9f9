//! The api operator: the whole server (`App`) behind its HTTP API, and an
//! operator that follows `GET /api/events` and decides each request with
//! `POST /api/approvals/{id}` over loopback, timing the server's own part.

use super::*;

pub(super) async fn rig_api(env: &Env, obs: &Arc<Observed>, bench: &Handle) -> Rig {
    let text = format!(
        "workspace_root = {root:?}\ndefault_agent = \"scripted\"\n\n[database]\npath = {db:?}\n\n\
         [[agent]]\nid = \"scripted\"\ncommand = {cmd:?}\nargs = {args:?}\n\n\
         [[workspace]]\nid = \"ws\"\npath = {ws:?}\n\n\
         [limits]\nmax_sessions = {max}\nstartup_timeout_secs = 120\nidle_timeout_secs = 3600\n\n\
         [stall]\ninactivity_secs = 0\n",
        root = env.dir.display().to_string(),
        db = env.dir.join("api.db").display().to_string(),
        cmd = env.profile.command,
        args = env.profile.args,
        ws = env.workspace.display().to_string(),
        max = env.n + 1,
    );
    let config = Config::from_toml_str(&text, &env.dir).expect("bench config");
    let store = SqliteStore::open(&config.database.path)
        .await
        .expect("store");
    let tracker: Arc<dyn OperatorSink> = Arc::new(BenchSink {
        obs: obs.clone(),
        answer: false,
    });
    let app = App::start(
        &config,
        store,
        AppOptions {
            extra_sinks: vec![tracker],
            bridge_url: None,
        },
    )
    .await
    .expect("app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(serve_on(
        listener,
        router(app.clone(), ApiToken::new(TOKEN)).layer(axum::middleware::from_fn_with_state(
            obs.clone(),
            time_decisions,
        )),
        async {
            let _ = stop_rx.await;
        },
    ));
    let client = {
        let _g = bench.enter();
        http_client()
    };
    let mut bench_tasks = Vec::new();
    // The operator: learns of requests from the local feed, answers over HTTP.
    let mut events = app.subscribe();
    {
        let (obs, client, base) = (obs.clone(), client.clone(), base.clone());
        bench_tasks.push(bench.spawn(async move {
            loop {
                match events.recv().await {
                    Ok(OperatorEvent::RequestOpened { request }) => {
                        let seen = Instant::now();
                        obs.saw(&request.id, seen);
                        if let Ok(mut h) = obs.handled.lock()
                            && !h.insert(request.id.clone())
                        {
                            continue;
                        }
                        let (obs, client, base) = (obs.clone(), client.clone(), base.clone());
                        tokio::spawn(async move {
                            approve(&client, &base, &request.id, &obs).await;
                            obs.delay(seen.elapsed());
                        });
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(k)) => {
                        obs.lagged.fetch_add(k, Ordering::Relaxed);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }));
    }
    // After lag only: sweeps the pending list so a lost event cannot hang the run.
    {
        let (obs, client, base) = (obs.clone(), client.clone(), base.clone());
        bench_tasks.push(bench.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if obs.lagged.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                let Ok((200, list)) =
                    call(&client, "GET", &base, "/api/approvals?status=pending", None).await
                else {
                    continue;
                };
                for a in list.as_array().cloned().unwrap_or_default() {
                    let Some(id) = a["id"].as_str().map(str::to_owned) else {
                        continue;
                    };
                    let fresh = obs
                        .handled
                        .lock()
                        .map(|mut h| h.insert(id.clone()))
                        .unwrap_or(false);
                    if fresh {
                        obs.swept.fetch_add(1, Ordering::Relaxed);
                        let (obs, client, base) = (obs.clone(), client.clone(), base.clone());
                        tokio::spawn(async move {
                            approve(&client, &base, &id, &obs).await;
                        });
                    }
                }
            }
        }));
    }
    Rig::Api {
        app,
        base,
        client,
        stop: Some(stop),
        served,
        bench_tasks,
    }
}

/// One API call; returns (status, body as JSON).
pub(super) async fn call(
    client: &HttpClient,
    method: &str,
    base: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), usize::MAX)
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Durations recorded in `m`, in µs, sorted (for [`pct`]).
pub(super) fn sorted_us(m: &Mutex<Vec<Duration>>) -> Vec<u64> {
    let mut us: Vec<u64> = m
        .lock()
        .map(|d| d.iter().map(|x| x.as_micros() as u64).collect())
        .unwrap_or_default();
    us.sort_unstable();
    us
}

/// Times the server's handling of each decision (`POST /api/approvals/..`).
pub(super) async fn time_decisions(
    State(obs): State<Arc<Observed>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let decision =
        req.method() == axum::http::Method::POST && req.uri().path().starts_with("/api/approvals/");
    let began = Instant::now();
    let response = next.run(req).await;
    if decision && let Ok(mut v) = obs.served.lock() {
        v.push(began.elapsed());
    }
    response
}

pub(super) async fn approve(client: &HttpClient, base: &str, id: &str, obs: &Observed) {
    let path = format!("/api/approvals/{id}");
    match call(
        client,
        "POST",
        base,
        &path,
        Some(json!({"decision": "approve"})),
    )
    .await
    {
        Ok((200, _)) => {}
        Ok((status, body)) => obs.error(format!("POST {path}: {status} {body}")),
        Err(e) => obs.error(format!("POST {path}: {e}")),
    }
}

//! The emulator's Socket Mode endpoint: one WebSocket per connection, the
//! hello frame, envelopes pushed by the test, acks recorded.

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::{Shared, WsCmd, lock};

pub(super) async fn accept_sockets(listener: TcpListener, st: Shared) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let st = st.clone();
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            let (tx, mut rx) = mpsc::unbounded_channel();
            {
                let mut g = lock(&st);
                g.connections += 1;
                g.socket = Some(tx);
            }
            let hello = json!({
                "type": "hello",
                "num_connections": 1,
                "debug_info": {"host": "emu", "approximate_connection_time": 18060},
                "connection_info": {"app_id": "A1"},
            });
            if ws
                .send(Message::Text(hello.to_string().into()))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(WsCmd::Send(text)) => {
                            if ws.send(Message::Text(text.into())).await.is_err() {
                                return;
                            }
                        }
                        Some(WsCmd::Disconnect) => {
                            let frame = json!({"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "emu"}});
                            let _ = ws.send(Message::Text(frame.to_string().into())).await;
                        }
                        Some(WsCmd::Drop) | None => return, // dropping the stream cuts TCP
                    },
                    frame = ws.next() => match frame {
                        Some(Ok(Message::Text(t))) => {
                            if let Ok(v) = serde_json::from_str::<Value>(&t)
                                && let Some(id) = v.get("envelope_id").and_then(Value::as_str)
                            {
                                lock(&st).acks.insert(id.to_owned());
                            }
                        }
                        Some(Ok(_)) => {}
                        _ => return,
                    },
                }
            }
        });
    }
}

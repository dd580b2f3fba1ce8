//! The connection layer: the accept loop over HTTP/1.1 connections with the limits a hostile
//! client meets before any handler runs — a bound on open connections (429 beyond), a deadline
//! for each request's headers that also closes idle kept-alive connections, bounds on the
//! number and size of headers (431) — and the graceful drain on SIGINT / SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::{AppState, Error, Result};

/// Binds `addr`, prints `lattice serve: listening on http://ADDR`, and serves until SIGINT or
/// SIGTERM; then stops accepting and gives in-flight requests `drain_timeout` to finish.
pub(crate) async fn run(addr: &str, state: Arc<AppState>) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener.local_addr()?;
    let options = state.options.clone();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(options.header_timeout)
        .max_headers(options.max_headers)
        .max_header_size(options.max_header_bytes)
        .max_buf_size(options.max_header_bytes.max(8192) * 4);
    let service = TowerToHyperService::new(crate::app::router(state));
    let slots = Arc::new(Semaphore::new(options.max_connections));
    let graceful = GracefulShutdown::new();
    eprintln!("lattice serve: listening on http://{local}");
    let shutdown = crate::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    eprintln!("lattice serve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Stream chunks are small writes: without TCP_NODELAY each waits for the client's
        // delayed ACK (~40 ms) on a kept-alive connection.
        let _ = tcp.set_nodelay(true);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(refuse(tcp, options.max_connections));
            continue;
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service.clone()));
        tokio::spawn(async move {
            // Errors here are the client's (reset, malformed, timed out): nothing to report.
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    eprintln!("lattice serve: shutting down, finishing in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => eprintln!("lattice serve: stopped"),
        _ = tokio::time::sleep(options.drain_timeout) => eprintln!(
            "lattice serve: stopped after {} s with requests still running (--drain-timeout)",
            options.drain_timeout.as_secs_f64()
        ),
    }
    Ok(())
}

/// Answers a connection over the limit with a 429 in the API's error shape, then closes it.
/// What the client sent first is read (for up to a second) so the close does not reset the
/// answer away.
async fn refuse(mut tcp: TcpStream, limit: usize) {
    let mut buf = [0u8; 8192];
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut buf)).await;
    let e = ApiError::too_many_connections(limit);
    let body = e.body().to_string();
    let head = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        tcp.write_all(head.as_bytes()).await?;
        tcp.write_all(body.as_bytes()).await?;
        tcp.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

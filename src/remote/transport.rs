//! How the client's requests travel: a [`Transport`] sends one HTTP request and reads its answer.
//! Natively that is ureq ([`Ureq`]); in the browser and Node, the platform's `fetch` (the wasm
//! front-end's). The client above it decides what to send, what to retry and what an answer means.

use std::time::Duration;

use futures::future::LocalBoxFuture;

/// One request. `body` is POSTed as JSON when given; without one the request is a GET.
pub struct HttpRequest<'a> {
    pub url: &'a str,
    pub body: Option<&'a [u8]>,
    /// Most bytes of the answer read; a longer answer fails the request.
    pub limit: u64,
    /// Limit on the whole request, from connecting to the answer's last byte.
    pub timeout: Duration,
    pub on_piece: Option<OnPiece<'a>>,
}

/// Called with each piece of a successful answer as it arrives (a stream of events); returning
/// `false` stops reading, and the answer ends there.
pub type OnPiece<'a> = &'a mut dyn FnMut(&[u8]) -> bool;

/// An answer of any status, its body read whole.
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

pub trait Transport: Send + Sync {
    /// Send `req`. An `Err` is a request that did not complete (refused, reset, timed out, an
    /// answer over the limit): worth sending again.
    fn request<'a>(&'a self, req: HttpRequest<'a>) -> LocalBoxFuture<'a, Result<HttpResponse, String>>;
    /// Wait `d` before a retry (without holding up a browser's event loop).
    fn sleep(&self, d: Duration) -> LocalBoxFuture<'static, ()>;
}

/// Blocking HTTP/1.1 through ureq: the caller's thread waits on the socket, as every native model
/// forward waits on its compute.
#[cfg(feature = "native")]
pub struct Ureq(ureq::Agent);

#[cfg(feature = "native")]
impl Default for Ureq {
    fn default() -> Self {
        // Statuses are the client's to read: an error answer carries the server's reason.
        Ureq(ureq::Agent::new_with_config(ureq::Agent::config_builder().http_status_as_error(false).build()))
    }
}

#[cfg(feature = "native")]
impl Transport for Ureq {
    fn request<'a>(&'a self, mut req: HttpRequest<'a>) -> LocalBoxFuture<'a, Result<HttpResponse, String>> {
        Box::pin(async move {
            let sent = match req.body {
                Some(b) => self
                    .0
                    .post(req.url)
                    .config()
                    .timeout_global(Some(req.timeout))
                    .build()
                    .header("Content-Type", "application/json")
                    .send(b),
                None => self.0.get(req.url).config().timeout_global(Some(req.timeout)).build().call(),
            };
            let mut resp = sent.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let mut reader = resp.body_mut().with_config().limit(req.limit).reader();
            let mut body = Vec::new();
            let mut piece = [0u8; 8192];
            loop {
                let n = std::io::Read::read(&mut reader, &mut piece).map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&piece[..n]);
                let more = match (&mut req.on_piece, (200..300).contains(&status)) {
                    (Some(f), true) => f(&piece[..n]),
                    _ => true,
                };
                if !more {
                    break;
                }
            }
            Ok(HttpResponse { status, body })
        })
    }

    fn sleep(&self, d: Duration) -> LocalBoxFuture<'static, ()> {
        std::thread::sleep(d);
        Box::pin(async {})
    }
}

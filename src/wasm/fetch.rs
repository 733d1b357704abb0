//! A server target's requests through the platform's `fetch`: in a browser's engine worker and
//! in Node alike. A request that overruns its time is aborted through an `AbortController`; an
//! answer is read piece by piece and refused once it passes its limit.

use std::time::Duration;

use futures::future::LocalBoxFuture;
use js_sys::{Promise, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, Headers, Request, RequestInit, Response, ReadableStreamDefaultReader};

use super::timer::{clear_timeout, millis, set_timeout};
use crate::remote::transport::{HttpRequest, HttpResponse, Transport};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(req: &Request) -> Promise;
}

pub struct Fetch;

/// The timer that aborts an overrunning request, cleared once the request is over however it
/// ended (its closure must outlive the timer).
struct Deadline {
    id: JsValue,
    _abort: Closure<dyn FnMut()>,
}

impl Drop for Deadline {
    fn drop(&mut self) {
        clear_timeout(&self.id);
    }
}

impl Transport for Fetch {
    fn request<'a>(&'a self, req: HttpRequest<'a>) -> LocalBoxFuture<'a, Result<HttpResponse, String>> {
        Box::pin(async move {
            let controller = AbortController::new().map_err(|e| describe(&e))?;
            let timeout = req.timeout;
            send(req, &controller).await.map_err(|e| match controller.signal().aborted() {
                true => format!("no answer within {:.1} s", timeout.as_secs_f64()),
                false => describe(&e),
            })
        })
    }

    fn sleep(&self, d: Duration) -> LocalBoxFuture<'static, ()> {
        Box::pin(super::timer::sleep(d))
    }
}

async fn send(mut req: HttpRequest<'_>, controller: &AbortController) -> Result<HttpResponse, JsValue> {
    let init = RequestInit::new();
    init.set_signal(Some(&controller.signal()));
    if let Some(body) = req.body {
        init.set_method("POST");
        let headers = Headers::new()?;
        headers.set("Content-Type", "application/json")?;
        init.set_headers(&headers);
        init.set_body(&Uint8Array::from(body));
    }
    let request = Request::new_with_str_and_init(req.url, &init)?;
    let c = controller.clone();
    let abort = Closure::<dyn FnMut()>::new(move || c.abort());
    let _deadline = Deadline { id: set_timeout(abort.as_ref().unchecked_ref(), millis(req.timeout)), _abort: abort };
    // Node's fetch objects come from its own classes, so no `instanceof` checks here.
    let resp: Response = JsFuture::from(global_fetch(&request)).await?.unchecked_into();
    let status = resp.status();
    let mut body = Vec::new();
    if let Some(stream) = resp.body() {
        let reader: ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
        loop {
            let chunk = JsFuture::from(reader.read()).await?;
            if Reflect::get(&chunk, &"done".into())?.as_bool() == Some(true) {
                break;
            }
            let piece: Uint8Array = Reflect::get(&chunk, &"value".into())?.unchecked_into();
            let start = body.len();
            if (start + piece.length() as usize) as u64 > req.limit {
                let _ = reader.cancel();
                return Err(JsValue::from_str(&format!("the answer is longer than {} bytes", req.limit)));
            }
            body.resize(start + piece.length() as usize, 0);
            piece.copy_to(&mut body[start..]);
            let more = match (&mut req.on_piece, (200..300).contains(&status)) {
                (Some(f), true) => f(&body[start..]),
                _ => true,
            };
            if !more {
                let _ = reader.cancel();
                break;
            }
        }
    }
    Ok(HttpResponse { status, body })
}

/// A thrown JS value in words: an `Error`'s message (with its cause's, which is where Node's
/// fetch says "connection refused"), or the value itself.
fn describe(e: &JsValue) -> String {
    match e.dyn_ref::<js_sys::Error>() {
        Some(err) => {
            let cause = Reflect::get(err, &"cause".into()).ok().filter(|c| !c.is_undefined() && !c.is_null());
            match cause {
                Some(c) => format!("{} ({})", String::from(err.message()), describe(&c)),
                None => err.message().into(),
            }
        }
        None => e.as_string().unwrap_or_else(|| format!("{e:?}")),
    }
}

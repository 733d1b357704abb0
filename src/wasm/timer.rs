//! `setTimeout` and `clearTimeout` from Rust, in a window, a worker or Node alike.

use std::time::Duration;

use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    pub fn set_timeout(f: &Function, ms: i32) -> JsValue;
    #[wasm_bindgen(js_name = clearTimeout)]
    pub fn clear_timeout(id: &JsValue);
}

/// `d` in the milliseconds `setTimeout` takes (at most its 2^31 - 1).
pub fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// Resolves after `d`.
pub async fn sleep(d: Duration) {
    let timer = Promise::new(&mut |resolve, _| {
        set_timeout(&resolve, millis(d));
    });
    let _ = JsFuture::from(timer).await;
}

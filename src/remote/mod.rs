//! A target model on a server: the client that verifies through one ([`client`], sending over a
//! [`transport`]: ureq natively, `fetch` in the browser and Node), and the server `saguaro serve`
//! runs ([`server`], over [`prefix`] caches and [`generate`]'s answers; native only). Both speak
//! SGLang's native `/generate` ([`protocol`]), so the client also works against an SGLang
//! deployment and the server against SGLang's clients.

pub mod client;
#[cfg(feature = "native")]
pub mod generate;
#[cfg(feature = "native")]
pub mod prefix;
pub mod protocol;
#[cfg(feature = "native")]
pub mod server;
pub mod transport;

pub use client::{RemoteLink, RemoteOptions, RemoteTarget};
#[cfg(feature = "native")]
pub use prefix::{session_bytes, PrefixCaches, PrefixModel};
#[cfg(feature = "native")]
pub use server::{bind, Endpoints, ServeOptions};

//! A target model on a server: the client that verifies through one ([`client`]), and the
//! server `saguaro serve` runs ([`server`], over [`prefix`] caches and [`generate`]'s answers).
//! Both speak SGLang's native `/generate` ([`protocol`]), so the client also works against an
//! SGLang deployment and the server against SGLang's clients.

pub mod client;
pub mod generate;
pub mod prefix;
pub mod protocol;
pub mod server;

pub use client::{RemoteLink, RemoteOptions, RemoteStats, RemoteTarget};
pub use prefix::{session_bytes, PrefixCaches, PrefixModel};
pub use server::{bind, ServeOptions};

//! Plain autoregressive decoding: one target forward per token. The baseline every speculative
//! strategy must reproduce exactly (greedy) or in distribution (sampling). With a target on a
//! server, the server generates on its own in one request.

use futures::future::LocalBoxFuture;

use super::generation::output::{Generation, Sink};
use super::generation::request::Request;
use super::generation::session::{next_mask, prefill};
use super::generation::target_rows::pick_next;
use super::strategy::Mode;
use super::strategy::{Placement, Run, SelfGenerating, Strategy};
use crate::error::Result;
use crate::model::runner::{append_masked, Lm, Want};

/// AR as the engine holds it: on the target, or on the server that is the target.
pub struct Autoregressive {
    server: Option<Box<dyn SelfGenerating>>,
}

impl Autoregressive {
    /// AR is always prepared: it needs nothing but the target.
    pub async fn prepare(p: &mut dyn Placement) -> Result<Option<Box<dyn Strategy>>> {
        Ok(Some(Box::new(Autoregressive { server: p.server() })))
    }
}

impl Strategy for Autoregressive {
    fn mode(&self) -> Mode {
        Mode::Ar
    }

    fn verifies(&self) -> bool {
        false
    }

    fn preference(&self) -> u8 {
        0
    }

    fn generate<'a>(&'a mut self, run: Run<'a>) -> LocalBoxFuture<'a, Result<Generation>> {
        match &mut self.server {
            Some(server) => server.generate(run.req, run.sink),
            None => Box::pin(generate_ar(run.target, run.req, run.sink)),
        }
    }
}

/// AR of `req` on `target`. Tokens a grammar forces join the output without a forward of their
/// own: the next forward runs them with the token before them.
pub async fn generate_ar(target: &mut dyn Lm, req: &Request, sink: Sink<'_>) -> Result<Generation> {
    let room = req.validate(target, 0)?;
    let mut run = prefill(target, req, Mode::Ar.name()).await?.decode(req, room, sink)?;
    let mut pending = vec![run.first];
    while !run.out.done() {
        while let Some(t) = run.out.push_forced()? {
            pending.push(t);
        }
        if run.out.done() {
            break;
        }
        let next = if req.sampling.is_greedy() {
            let allowed = next_mask(&mut run.out, pending.len())?;
            *append_masked(target, &pending, Want::AllArgmax, allowed).await?.argmax().last().expect("a row per token")
        } else {
            let allowed = next_mask(&mut run.out, 1)?;
            pick_next(target, &pending, &req.sampling, &mut run.rng, allowed).await?
        };
        run.stats.rounds += 1;
        run.out.push(&[next])?;
        pending = vec![next];
    }
    Ok(run.finish(|stats| stats.target_busy_ms = stats.decode_ms))
}

//! What a server target cost each mode: requests per generated token (SD and SSD: each one
//! target forward on the server), bytes per request each way, and time per request on the wire and on the
//! server. Printed under the bench's table when the target is a server.

use serde::Serialize;

use saguaro::decode::RemoteStats;

use super::report::label;
use super::Run;

#[derive(Serialize)]
pub struct ServerRow {
    pub mode: String,
    pub requests_per_token: f64,
    pub retries: usize,
    pub bytes_sent_per_request: f64,
    pub bytes_received_per_request: f64,
    pub round_trip_ms_per_request: f64,
    pub server_ms_per_request: f64,
}

/// One row per run whose generations went to a server.
pub fn rows(runs: &[Run]) -> Vec<ServerRow> {
    runs.iter()
        .filter_map(|r| {
            let stats: Vec<&RemoteStats> = r.gens.iter().filter_map(|g| g.stats.remote.as_ref()).collect();
            if stats.is_empty() {
                return None;
            }
            let sum = |f: &dyn Fn(&RemoteStats) -> f64| stats.iter().map(|s| f(s)).sum::<f64>();
            let requests = sum(&|s| s.round_trips as f64).max(1.0);
            let tokens = r.gens.iter().map(|g| g.stats.generated).sum::<usize>().max(1) as f64;
            Some(ServerRow {
                mode: label(r),
                requests_per_token: requests / tokens,
                retries: stats.iter().map(|s| s.retries).sum(),
                bytes_sent_per_request: sum(&|s| s.bytes_sent as f64) / requests,
                bytes_received_per_request: sum(&|s| s.bytes_received as f64) / requests,
                round_trip_ms_per_request: sum(&|s| s.round_trip_ms) / requests,
                server_ms_per_request: sum(&|s| s.server_ms) / requests,
            })
        })
        .collect()
}

pub fn print(rows: &[ServerRow]) {
    println!(
        "{:<22} {:>12} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "server", "requests/tok", "retries", "B up/req", "B dn/req", "rtt ms", "server ms"
    );
    for r in rows {
        println!(
            "{:<22} {:>12.3} {:>7} {:>9.0} {:>9.0} {:>9.1} {:>9.1}",
            r.mode,
            r.requests_per_token,
            r.retries,
            r.bytes_sent_per_request,
            r.bytes_received_per_request,
            r.round_trip_ms_per_request,
            r.server_ms_per_request
        );
    }
    println!("(SD, SSD: one target forward per request, the prefill's included; AR: the server generates on its own,");
    println!(" one forward per token, in one request; rtt: as the client saw it)");
}

//! `saguaro bench --plot FILE.svg`: tokens/s by mode and K as a plain SVG line chart, one series
//! per mode; a mode run without a K (AR, or auto choosing its own) and llama.cpp are level lines.

use std::fmt::Write;

use super::report::Row;

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round step of about a fifth of `max`: 1, 2 or 5 times a power of ten.
fn tick_step(max: f64) -> f64 {
    let raw = max / 5.0;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * p).find(|&s| s >= raw).unwrap_or(10.0 * p)
}

struct Axes {
    ks: Vec<usize>,
    y_max: f64,
}

impl Axes {
    fn x(&self, k: usize) -> f64 {
        let width = W - LEFT - RIGHT;
        match (self.ks.first(), self.ks.last()) {
            (Some(&lo), Some(&hi)) if hi > lo => LEFT + width * 0.05 + width * 0.9 * (k - lo) as f64 / (hi - lo) as f64,
            _ => LEFT + width / 2.0,
        }
    }

    fn y(&self, v: f64) -> f64 {
        H - BOTTOM - (H - TOP - BOTTOM) * v / self.y_max
    }
}

fn level_line(out: &mut String, a: &Axes, v: f64, color: &str, dash: &str) {
    let y = a.y(v);
    let _ = writeln!(
        out,
        r#"    <line x1="{LEFT:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
        W - RIGHT
    );
}

fn legend(out: &mut String, i: usize, name: &str, color: &str) {
    let y = TOP + 10.0 + 22.0 * i as f64;
    let x = W - RIGHT + 16.0;
    let _ = writeln!(out, r#"    <rect x="{x:.1}" y="{:.1}" width="14" height="4" fill="{color}"/>"#, y - 2.0);
    let _ = writeln!(out, r#"    <text x="{:.1}" y="{:.1}" font-size="13">{}</text>"#, x + 20.0, y + 4.0, escape(name));
}

/// The SVG text of tokens/s per row, by series and K, with `llama` (tokens/s) as a reference.
pub fn svg(rows: &[Row], llama: Option<f64>) -> String {
    let mut series: Vec<&str> = Vec::new();
    for r in rows {
        if !series.contains(&r.series.as_str()) {
            series.push(&r.series);
        }
    }
    let mut ks: Vec<usize> = rows.iter().filter_map(|r| r.k).collect();
    ks.sort_unstable();
    ks.dedup();
    let top = rows.iter().map(|r| r.tokens_per_s).chain(llama).fold(0.0, f64::max);
    let step = tick_step(if top > 0.0 { top * 1.1 } else { 1.0 });
    let y_max = step * ((top * 1.1 / step).ceil()).max(1.0);
    let a = Axes { ks, y_max };

    let mut out = String::new();
    let _ = writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"  <rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(out, r#"  <text x="{LEFT}" y="24" font-size="15">saguaro bench: decode tokens/s by mode and K</text>"#);
    // Axes, grid and tick labels.
    let _ = writeln!(out, r##"  <g class="axes" stroke="#888" font-size="12">"##);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    for i in 0..=(y_max / step).round() as usize {
        let v = i as f64 * step;
        let y = a.y(v);
        let _ = writeln!(out, r##"    <line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/>"##, W - RIGHT);
        let _ = writeln!(
            out,
            r#"    <text x="{:.1}" y="{:.1}" text-anchor="end" stroke="none">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            format!("{v:.decimals$}")
        );
    }
    for &k in &a.ks {
        let x = a.x(k);
        let _ = writeln!(
            out,
            r#"    <text x="{x:.1}" y="{:.1}" text-anchor="middle" stroke="none">{k}</text>"#,
            H - BOTTOM + 18.0
        );
    }
    let _ = writeln!(out, r#"    <line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}"/>"#, H - BOTTOM);
    let _ = writeln!(out, r#"    <line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#, H - BOTTOM, W - RIGHT, H - BOTTOM);
    let _ = writeln!(
        out,
        r#"    <text x="{:.1}" y="{:.1}" text-anchor="middle" stroke="none">K (draft tokens per round)</text>"#,
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 14.0
    );
    let _ = writeln!(
        out,
        r#"    <text x="16" y="{:.1}" text-anchor="middle" stroke="none" transform="rotate(-90 16 {:.1})">tokens/s</text>"#,
        TOP + (H - TOP - BOTTOM) / 2.0,
        TOP + (H - TOP - BOTTOM) / 2.0
    );
    let _ = writeln!(out, "  </g>");
    for (i, name) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(out, r#"  <g class="series" data-mode="{}">"#, escape(name));
        let mine: Vec<&Row> = rows.iter().filter(|r| r.series == *name).collect();
        let mut points: Vec<(usize, f64)> = mine.iter().filter_map(|r| r.k.map(|k| (k, r.tokens_per_s))).collect();
        points.sort_by_key(|p| p.0);
        for r in mine.iter().filter(|r| r.k.is_none()) {
            level_line(&mut out, &a, r.tokens_per_s, color, "6 4");
        }
        if !points.is_empty() {
            let path: Vec<String> = points.iter().map(|&(k, v)| format!("{:.1},{:.1}", a.x(k), a.y(v))).collect();
            let _ = writeln!(
                out,
                r#"    <polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                path.join(" ")
            );
            for &(k, v) in &points {
                let _ = writeln!(out, r#"    <circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"/>"#, a.x(k), a.y(v));
            }
        }
        legend(&mut out, i, name, color);
        let _ = writeln!(out, "  </g>");
    }
    if let Some(l) = llama {
        let _ = writeln!(out, r#"  <g class="reference" data-name="llama.cpp">"#);
        level_line(&mut out, &a, l, "#555", "2 3");
        legend(&mut out, series.len(), "llama.cpp decode", "#555");
        let _ = writeln!(out, "  </g>");
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(50.0), 10.0);
        assert_eq!(tick_step(7.0), 2.0);
        assert!((tick_step(0.4) - 0.1).abs() < 1e-12);
    }
}

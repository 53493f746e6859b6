//! The SVG plot: latency percentile curves per target, one panel per cell.
//!
//! The x axis counts "nines" (1 = p90, 2 = p99, 3 = p99.9), so tails get the
//! room they deserve; the y axis is logarithmic milliseconds, so a direct
//! call at 0.1 ms and a held stream at 1 s share a scale. Drawn with
//! plotters' SVG backend only (no font files: text stays SVG `<text>`).

use plotters::prelude::*;

use crate::report::{CellReport, Report};

/// Panels per row.
const COLUMNS: usize = 3;
/// Size of one panel, pixels.
const PANEL: (u32, u32) = (460, 320);

/// Why the plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// plotters failed (message only: its error type borrows the backend).
    #[error("drawing the plot: {0}")]
    Draw(String),
}

fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

fn color(target: &str) -> RGBColor {
    match target {
        "direct" => RGBColor(31, 119, 180),
        "nginx" => RGBColor(44, 160, 44),
        "hyper" => RGBColor(148, 103, 189),
        "firewall" => RGBColor(214, 39, 40),
        "firewall-noaudit" => RGBColor(255, 127, 14),
        "firewall-redis" => RGBColor(140, 86, 75),
        "firewall-h2up" => RGBColor(227, 119, 194),
        "firewall-unscreened" => RGBColor(188, 189, 34),
        "firewall-unchained" => RGBColor(23, 190, 207),
        "firewall-shadow" => RGBColor(127, 127, 127),
        "firewall-baseline" => RGBColor(140, 86, 75),
        _ => RGBColor(100, 100, 100),
    }
}

fn nines(percentile: f64) -> f64 {
    let rest = (1.0 - percentile / 100.0).max(1e-6);
    -rest.log10()
}

/// Renders the report's cells as an SVG document.
pub fn svg(report: &Report) -> Result<String, PlotError> {
    let cells: Vec<&CellReport> = report
        .cells
        .iter()
        .filter(|c| c.targets.iter().any(|t| !t.curve.is_empty()))
        .collect();
    let rows = cells.len().div_ceil(COLUMNS).max(1);
    let cols = cells.len().clamp(1, COLUMNS);
    let size = (PANEL.0 * cols as u32, PANEL.1 * rows as u32 + 40);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root
            .titled(
                &format!(
                    "mcp-bench latency percentiles ({} profile, medians of {} rounds per target)",
                    report.meta.profile, report.meta.rounds
                ),
                ("sans-serif", 20),
            )
            .map_err(draw_err)?;
        let panels = root.split_evenly((rows, cols));
        for (cell, area) in cells.iter().zip(panels.iter()) {
            panel(cell, area)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(out)
}

fn panel<DB: DrawingBackend>(
    cell: &CellReport,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), PlotError> {
    let points = cell.targets.iter().flat_map(|t| t.curve.iter());
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for p in points {
        lo = lo.min(p.ms.max(0.001));
        hi = hi.max(p.ms);
    }
    if hi <= 0.0 {
        return Ok(());
    }
    let lo = (lo * 0.8).max(0.001);
    let hi = hi * 1.25;
    let mut chart = ChartBuilder::on(area)
        .caption(cell.title(), ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0f64..4.0f64, (lo..hi).log_scale())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_label_formatter(&|x| match x.round() as i64 {
            0 => "p0".to_owned(),
            1 => "p90".to_owned(),
            2 => "p99".to_owned(),
            3 => "p99.9".to_owned(),
            _ => "p99.99".to_owned(),
        })
        .y_desc("ms")
        .y_label_formatter(&|y| {
            if *y >= 10.0 {
                format!("{y:.0}")
            } else if *y >= 1.0 {
                format!("{y:.1}")
            } else {
                format!("{y:.2}")
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(draw_err)?;
    for t in &cell.targets {
        if t.curve.is_empty() {
            continue;
        }
        let c = color(&t.target);
        let series: Vec<(f64, f64)> = t
            .curve
            .iter()
            .map(|p| (nines(p.percentile).min(4.0), p.ms.max(lo)))
            .collect();
        chart
            .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))
            .map_err(draw_err)?
            .label(t.target.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(series.into_iter().map(|p| Circle::new(p, 2, c.filled())))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{CurvePoint, Figures, Meta, TargetReport};
    use std::collections::BTreeMap;

    fn target(name: &str, scale: f64) -> TargetReport {
        TargetReport {
            target: name.to_owned(),
            median: Figures::default(),
            ratio_direct: None,
            ratio_nginx: None,
            rounds: Vec::new(),
            errors: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            curve: (0..=16)
                .map(|k| CurvePoint {
                    percentile: (1.0 - 10f64.powf(-f64::from(k) / 4.0)) * 100.0,
                    ms: scale * (1.0 + f64::from(k)),
                })
                .collect(),
            scale: None,
        }
    }

    #[test]
    fn svg_has_a_panel_and_a_line_per_target() {
        let report = Report {
            meta: Meta {
                profile: "test".into(),
                rounds: 3,
                ..Meta::default()
            },
            cells: vec![CellReport {
                scenario: "call".into(),
                proto: "h1".into(),
                concurrency: 16,
                rate: None,
                targets: vec![
                    target("direct", 0.05),
                    target("nginx", 0.1),
                    target("firewall", 0.2),
                ],
            }],
            audit: None,
            notes: Vec::new(),
            instances: Vec::new(),
            verdicts: Vec::new(),
            step_verdicts: Vec::new(),
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("call h1 c=16"));
        for name in ["direct", "nginx", "firewall"] {
            assert!(svg.contains(name), "{name}");
            // The curve and its legend sample, in the target's colour.
            let c = color(name);
            let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            assert_eq!(svg.matches(&stroke).count(), 2, "{name}: {stroke}");
        }
    }

    #[test]
    fn nines_map_percentiles_to_the_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines(100.0), 6.0);
    }
}

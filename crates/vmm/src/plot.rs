//! The benchmarks' SVG plots, drawn with plotters.
//!
//! The SVG backend writes text as `<text>` elements that the viewer lays
//! out, so no font files or font libraries are needed (plotters is built
//! without its font backends; its layout estimates text sizes).

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::time::Duration;

const SIZE: (u32, u32) = (960, 560);
const BAR: RGBColor = RGBColor(0x4e, 0x79, 0xa7);
const LINE: RGBColor = RGBColor(0xf2, 0x8e, 0x2b);
const REFERENCE: RGBColor = RGBColor(0xc0, 0x20, 0x20);
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);

/// One bar: a value, an optional reference value drawn across it, and a
/// note written above it, after the value (a note that starts with a
/// sign is the value itself, written instead of it).
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub reference: Option<f64>,
    pub note: String,
}

/// A round number with an SI suffix: `0`, `500k`, `2M`, `12.5M`.
pub fn si(v: f64) -> String {
    let (scaled, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .iter()
        .find(|(scale, _)| v.abs() >= *scale)
        .map_or((v, ""), |&(scale, suffix)| (v / scale, suffix));
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

/// Seconds as a duration label (`100us`, `1ms`, `20ms`).
fn duration_label(secs: f64) -> String {
    crate::units::format_duration(Duration::from_nanos((secs * 1e9).round() as u64))
}

/// The legend box both plots draw, at `position`.
fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(error)
}

fn error(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Title (large) and subtitle (small) across the top of `root`; returns
/// the area below them.
fn titled<'a>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<SVGBackend<'a>, plotters::coord::Shift>, String> {
    root.fill(&WHITE).map_err(error)?;
    let center = SIZE.0 as i32 / 2;
    let style = |size: u32| {
        ("sans-serif", size)
            .into_font()
            .into_text_style(root)
            .pos(Pos::new(HPos::Center, VPos::Top))
    };
    root.draw(&Text::new(title, (center, 12), style(22)))
        .map_err(error)?;
    root.draw(&Text::new(subtitle, (center, 42), style(13)))
        .map_err(error)?;
    Ok(root.split_vertically(64).1)
}

/// A bar chart with a dashed reference mark across each bar that has one.
pub fn bars(
    path: &Path,
    title: &str,
    subtitle: &str,
    y_label: &str,
    reference_label: &str,
    bars: &[Bar],
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let body = titled(&root, title, subtitle)?;
    draw_bars(&body, y_label, reference_label, bars, 15)?;
    root.present().map_err(error)
}

/// Bar charts side by side, each under its own heading, each with its
/// own y axis (as [`bars`]).
pub fn bar_panels(
    path: &Path,
    title: &str,
    subtitle: &str,
    y_label: &str,
    reference_label: &str,
    panels: &[(String, Vec<Bar>)],
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let body = titled(&root, title, subtitle)?;
    let areas = body.split_evenly((1, panels.len().max(1)));
    for ((heading, bars), area) in panels.iter().zip(&areas) {
        let (head, rest) = area.split_vertically(24);
        let (w, _) = head.dim_in_pixel();
        head.draw(&Text::new(
            heading.as_str(),
            (w as i32 / 2, 4),
            ("sans-serif", 16)
                .into_font()
                .into_text_style(&head)
                .pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(error)?;
        draw_bars(&rest, y_label, reference_label, bars, 12)?;
    }
    root.present().map_err(error)
}

/// The bars into `area`, x labels at `label_size` pixels.
fn draw_bars<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    y_label: &str,
    reference_label: &str,
    bars: &[Bar],
    label_size: u32,
) -> Result<(), String> {
    let values = || {
        bars.iter()
            .flat_map(|b| [b.value, b.reference.unwrap_or(0.0)])
    };
    let top = values().fold(0.0, f64::max);
    // Room above the tallest bar for its note and the legend.
    let top = if top > 0.0 { top * 1.3 } else { 1.0 };
    // Negative values (a change that is a loss) below the axis.
    let bottom = values().fold(0.0, f64::min) * 1.3;
    // A segmented 0..last has last + 1 segments, one per bar; a range of
    // one value has no width, so a lone bar gets an empty slot beside it.
    let last = (bars.len() as u32).saturating_sub(1).max(1);
    let mut chart = ChartBuilder::on(area)
        .margin_left(20)
        .margin_right(30)
        .margin_bottom(10)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d((0u32..last).into_segmented(), bottom..top)
        .map_err(error)?;
    let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
    // A sixth of each bar's slot on either side of it.
    let (width, _) = area.dim_in_pixel();
    let gap = (width.saturating_sub(140) / bars.len().max(1) as u32 / 6).min(25);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .y_desc(y_label)
        .y_label_formatter(&|v| si(*v))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).unwrap_or(&"").to_string(),
            _ => String::new(),
        })
        .x_label_style(("sans-serif", label_size))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let i = i as u32;
            let mut rect = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), b.value),
                ],
                BAR.filled(),
            );
            rect.set_margin(0, 0, gap, gap);
            rect
        }))
        .map_err(error)?;
    let note_style = ("sans-serif", 13)
        .into_font()
        .into_text_style(area)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            // Above the bar and its reference mark, so the mark never
            // crosses the note.
            let at = b.value.max(b.reference.unwrap_or(0.0));
            let text = if b.note.is_empty() {
                si(b.value)
            } else if b.note.starts_with(['+', '-']) {
                b.note.clone()
            } else {
                format!("{}  {}", si(b.value), b.note)
            };
            // Clear of the reference mark's stroke.
            EmptyElement::at((SegmentValue::CenterOf(i as u32), at.max(0.0)))
                + Text::new(text, (0, -10), note_style.clone())
        }))
        .map_err(error)?;
    let mut labelled = false;
    for (i, b) in bars.iter().enumerate() {
        let Some(r) = b.reference else { continue };
        let i = i as u32;
        let series = chart
            .draw_series(DashedLineSeries::new(
                [(SegmentValue::Exact(i), r), (SegmentValue::Exact(i + 1), r)],
                8,
                5,
                REFERENCE.stroke_width(3),
            ))
            .map_err(error)?;
        if !labelled {
            labelled = true;
            series.label(reference_label).legend(|(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], REFERENCE.stroke_width(3))
            });
        }
    }
    if labelled {
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    Ok(())
}

/// A line of `(seconds, value)` points over a logarithmic time axis, with
/// a dashed horizontal reference line.
pub fn sweep(
    path: &Path,
    title: &str,
    subtitle: &str,
    x_label: &str,
    y_label: &str,
    points: &[(f64, f64)],
    reference: (&str, f64),
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let body = titled(&root, title, subtitle)?;
    let (x_min, x_max) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let (x_min, x_max) = if x_min <= x_max {
        (x_min / 2.0, x_max * 2.0)
    } else {
        (1e-4, 1e-1)
    };
    let top = points
        .iter()
        .map(|p| p.1)
        .fold(reference.1, f64::max)
        .max(1.0)
        * 1.2;
    let mut chart = ChartBuilder::on(&body)
        .margin_left(20)
        .margin_right(30)
        .margin_bottom(10)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0f64..top)
        .map_err(error)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| duration_label(*v))
        .y_label_formatter(&|v| si(*v))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(error)?;
    chart
        .draw_series(LineSeries::new(
            [(x_min, 1.0), (x_max, 1.0)],
            BLACK.mix(0.4).stroke_width(1),
        ))
        .map_err(error)?
        .label("no gain (pv = off)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    chart
        .draw_series(DashedLineSeries::new(
            [(x_min, reference.1), (x_max, reference.1)],
            8,
            5,
            REFERENCE.stroke_width(2),
        ))
        .map_err(error)?
        .label(format!("{} ({})", reference.0, reference.1))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], REFERENCE.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            LINE.stroke_width(3),
        ))
        .map_err(error)?
        .label("faultline pv / off")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LINE.stroke_width(3)));
    let value_style = ("sans-serif", 13)
        .into_font()
        .into_text_style(&body)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(points.iter().map(|&(x, y)| {
            EmptyElement::at((x, y))
                + Circle::new((0, 0), 5, LINE.filled())
                + Text::new(format!("{y:.2}"), (0, -9), value_style.clone())
        }))
        .map_err(error)?;
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(error)
}

/// A named line of `(x, y)` points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart of [`panels`]: lines and, optionally, labelled reference
/// points (drawn as crosses).
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
    pub reference: Option<(String, Vec<(f64, f64)>)>,
}

/// Line colours, one per series.
const SERIES: [RGBColor; 4] = [
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x59, 0xa1, 0x4f),
];

/// Charts side by side sharing a logarithmic x axis, each with a
/// logarithmic y axis (values far apart, as slow and fast zaps are).
pub fn panels(
    path: &Path,
    title: &str,
    subtitle: &str,
    x_label: &str,
    panels: &[Panel],
) -> Result<(), String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let body = titled(&root, title, subtitle)?;
    let areas = body.split_evenly((1, panels.len().max(1)));
    for (panel, area) in panels.iter().zip(&areas) {
        let points = || {
            panel
                .series
                .iter()
                .flat_map(|s| s.points.iter())
                .chain(panel.reference.iter().flat_map(|r| r.1.iter()))
                .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        };
        let (x_min, x_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        let (y_min, y_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
        let (x_min, x_max) = if x_min <= x_max {
            (x_min / 1.5, x_max * 1.5)
        } else {
            (1.0, 10.0)
        };
        let (y_min, y_max) = if y_min <= y_max {
            (y_min / 3.0, y_max * 3.0)
        } else {
            (0.1, 10.0)
        };
        // Ticks at the data's x values (one size has one tick, at it).
        let mut keys: Vec<f64> = points().map(|p| p.0).collect();
        keys.sort_by(f64::total_cmp);
        keys.dedup();
        let mut chart = ChartBuilder::on(area)
            .margin_left(10)
            .margin_right(20)
            .margin_bottom(10)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x_min..x_max).log_scale().with_key_points(keys),
                (y_min..y_max).log_scale(),
            )
            .map_err(error)?;
        chart
            .configure_mesh()
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .x_desc(x_label)
            .y_desc(panel.y_label.as_str())
            // The data's own values (2048, not 2.05k).
            .x_label_formatter(&|v| {
                if v.fract() == 0.0 && v.abs() < 1e7 {
                    format!("{v:.0}")
                } else {
                    si(*v)
                }
            })
            .y_label_formatter(&|v| si(*v))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(error)?;
        let count = panel.series.len() as u32;
        for (i, series) in panel.series.iter().enumerate() {
            let color = SERIES[i % SERIES.len()];
            // Earlier series wider and larger, so equal points show as
            // rings rather than hiding each other.
            let size = 3 + 2 * (count - 1 - i as u32);
            let positive: Vec<(f64, f64)> = series
                .points
                .iter()
                .copied()
                .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                .collect();
            chart
                .draw_series(LineSeries::new(positive.clone(), color.stroke_width(size)))
                .map_err(error)?
                .label(series.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3))
                });
            chart
                .draw_series(
                    positive
                        .iter()
                        .map(|&p| Circle::new(p, size + 2, color.filled())),
                )
                .map_err(error)?;
        }
        if let Some((label, points)) = &panel.reference {
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&p| Cross::new(p, 7, REFERENCE.stroke_width(3))),
                )
                .map_err(error)?
                .label(label.as_str())
                .legend(|(x, y)| Cross::new((x + 10, y), 5, REFERENCE.stroke_width(2)));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present().map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_round() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(2e6), "2M");
        assert_eq!(si(12.5e6), "12.5M");
        assert_eq!(si(500e3), "500k");
        assert_eq!(si(1.5), "1.5");
        assert_eq!(duration_label(1e-4), "100us");
        assert_eq!(duration_label(0.02), "20ms");
    }

    /// The trimmed contents of the SVG's text elements.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("</text>")
            .filter_map(|chunk| Some(chunk.rsplit_once('>')?.1.trim().to_string()))
            .collect()
    }

    #[test]
    fn charts_are_svg_with_every_label_and_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bars.svg");
        let b = |label: &str, value, reference| Bar {
            label: label.into(),
            value,
            reference,
            note: format!("{label} note"),
        };
        bars(
            &path,
            "title <1>",
            "sub",
            "work",
            "seed",
            &[
                b("off", 1e7, Some(1e7)),
                b("pv", 2e7, Some(1.9e7)),
                b("ideal", 3e7, None),
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let found = texts(&svg);
        for text in ["title &lt;1&gt;", "pv", "30M  ideal note", "seed", "20M"] {
            assert!(found.iter().any(|t| t == text), "{text}: {found:?}");
        }
        assert!(svg.contains("stroke-dasharray") || svg.matches("<polyline").count() >= 2);
        let path = dir.path().join("sweep.svg");
        sweep(
            &path,
            "t",
            "s",
            "latency",
            "gain",
            &[(1e-4, 1.2), (1e-3, 1.5), (2e-2, 2.5)],
            ("seed", 1.91),
        )
        .unwrap();
        let found = texts(&std::fs::read_to_string(&path).unwrap());
        for text in ["1ms", "2.50", "seed (1.91)", "latency"] {
            assert!(found.iter().any(|t| t == text), "{text}: {found:?}");
        }
        let path = dir.path().join("panels.svg");
        let line = |label: &str, k: f64| Series {
            label: label.into(),
            points: vec![(256.0, k), (2048.0, 8.0 * k)],
        };
        panels(
            &path,
            "t",
            "s",
            "memory",
            &[
                Panel {
                    y_label: "op ms".into(),
                    series: vec![line("slow", 1.0), line("fast", 0.01)],
                    reference: Some(("seed".into(), vec![(2048.0, 46.1)])),
                },
                Panel {
                    y_label: "stall us".into(),
                    series: vec![line("slow", 100.0), line("fast", 0.0)],
                    reference: None,
                },
            ],
        )
        .unwrap();
        let found = texts(&std::fs::read_to_string(&path).unwrap());
        for text in ["op ms", "stall us", "slow", "fast", "seed", "memory"] {
            assert!(found.iter().any(|t| t == text), "{text}: {found:?}");
        }
    }
}

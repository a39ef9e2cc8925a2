//! Small SVG charts for the benchmarks (bars and lines), written by hand:
//! a few dozen lines of SVG need no plotting stack or fonts.

use std::fmt::Write;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 5] = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(title: &str, y_label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + (HEIGHT - TOP - BOTTOM) / 2.0,
        escape(y_label)
    );
    s
}

/// Y axis with 5 gridlines from 0 to `max`.
fn y_axis(s: &mut String, max: f64) {
    let plot_h = HEIGHT - TOP - BOTTOM;
    for i in 0..=5 {
        let v = max * i as f64 / 5.0;
        let y = TOP + plot_h - plot_h * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            short(v)
        );
    }
}

fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A bar chart: one bar per (label, value), with `note` under each label.
pub fn bars(title: &str, y_label: &str, bars: &[(String, f64, String)]) -> String {
    let mut s = header(title, y_label);
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    y_axis(&mut s, max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / bars.len().max(1) as f64;
    for (i, (label, value, note)) in bars.iter().enumerate() {
        let h = plot_h * value / max;
        let x = LEFT + slot * i as f64 + slot * 0.2;
        let w = slot * 0.6;
        let y = TOP + plot_h - h;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{}"/>"#,
            COLORS[i % COLORS.len()]
        );
        let cx = x + w / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            y - 5.0,
            short(*value)
        );
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
            TOP + plot_h + 20.0,
            escape(label)
        );
        let _ = writeln!(
            s,
            r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            TOP + plot_h + 38.0,
            escape(note)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A line chart of `points` (x labels in order, y values).
pub fn line(title: &str, x_label: &str, y_label: &str, points: &[(String, f64)]) -> String {
    let mut s = header(title, y_label);
    let max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    y_axis(&mut s, max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let step = plot_w / points.len().max(1) as f64;
    let coords: Vec<(f64, f64)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                LEFT + step * (i as f64 + 0.5),
                TOP + plot_h - plot_h * p.1 / max,
            )
        })
        .collect();
    let path: Vec<String> = coords
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
        path.join(" "),
        COLORS[0]
    );
    for ((x, y), (label, value)) in coords.iter().zip(points) {
        let _ = writeln!(
            s,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{}"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            COLORS[0],
            y - 8.0,
            short(*value)
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + plot_h + 20.0,
            escape(label)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0,
        escape(x_label)
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg_with_every_label() {
        let svg = bars(
            "t <1>",
            "work",
            &[
                ("off".into(), 10.0, "1.00x".into()),
                ("pv".into(), 20.0, "2.00x".into()),
            ],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;1&gt;") && svg.contains(">pv<") && svg.contains("2.00x"));
        assert_eq!(svg.matches("<rect").count(), 3, "background and two bars");
        let svg = line(
            "sweep",
            "latency",
            "gain",
            &[("1ms".into(), 1.5), ("4ms".into(), 2.5)],
        );
        assert!(svg.contains("<polyline") && svg.contains(">4ms<"));
    }
}

//! Line charts as standalone SVG: enough for the evaluation's plots without a plotting
//! dependency.

use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<Series>,
}

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Chart {
    /// The chart as an SVG document. Non-finite points (and non-positive ones on a log
    /// axis) are left out.
    pub fn to_svg(&self) -> String {
        let fx = |x: f64| if self.log_x { x.log10() } else { x };
        let usable =
            |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!self.log_x || x > 0.0);
        let points = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter(|p| usable(p)));
        let (mut x0, mut x1, mut y0, mut y1) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        );
        for &(x, y) in points {
            x0 = x0.min(fx(x));
            x1 = x1.max(fx(x));
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !(x0.is_finite() && y0.is_finite()) {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        y0 = y0.min(0.0);
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let px = |x: f64| LEFT + (fx(x) - x0) / (x1 - x0) * pw;
        let py = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        // Axes, ticks and grid.
        let _ = writeln!(
            svg,
            r#"<path d="M{LEFT},{TOP} V{} H{}" stroke="black" fill="none"/>"#,
            TOP + ph,
            LEFT + pw
        );
        for i in 0..=5 {
            let t = i as f64 / 5.0;
            let xv = x0 + t * (x1 - x0);
            let label = if self.log_x { 10f64.powf(xv) } else { xv };
            let x = LEFT + t * pw;
            let _ = writeln!(
                svg,
                r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 16.0,
                tick(label)
            );
            let yv = y0 + t * (y1 - y0);
            let y = TOP + ph - t * ph;
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                tick(yv)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            H - 14.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let path: Vec<String> = s
                .points
                .iter()
                .filter(|p| usable(p))
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            if !path.is_empty() {
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.8"/>"#,
                    path.join(" ")
                );
            }
            let ly = TOP + 10.0 + i as f64 * 18.0;
            let lx = LEFT + pw + 14.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0,
                escape(&s.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

fn tick(v: f64) -> String {
    let a = v.abs();
    if a >= 10.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_one_line_per_series() {
        let chart = Chart {
            title: "JCT <CDF>".into(),
            x_label: "hours".into(),
            y_label: "share".into(),
            log_x: true,
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![
                        (0.1, 0.0),
                        (1.0, 0.5),
                        (10.0, 1.0),
                        (0.0, 0.2),
                        (f64::NAN, 1.0),
                    ],
                },
                Series {
                    name: "b".into(),
                    points: vec![],
                },
            ],
        };
        let svg = chart.to_svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polyline").count(),
            1,
            "the empty series draws no line"
        );
        assert!(svg.contains("JCT &lt;CDF&gt;"));
        // Three usable points of "a" (zero and NaN left out on a log axis).
        let line = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        assert_eq!(line.split(' ').filter(|p| p.contains(',')).count(), 3);
    }
}

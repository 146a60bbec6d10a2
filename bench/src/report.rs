//! Results: samples of one run, rows aggregated over runs (the median), targets, the printed
//! table and the JSON document.

use serde::Serialize;

/// Which side of its target a metric should be on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    AtLeast,
    AtMost,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Target {
    pub goal: Goal,
    pub value: f64,
}

impl Target {
    pub fn at_least(value: f64) -> Option<Target> {
        Some(Target {
            goal: Goal::AtLeast,
            value,
        })
    }

    pub fn at_most(value: f64) -> Option<Target> {
        Some(Target {
            goal: Goal::AtMost,
            value,
        })
    }

    pub fn met_by(&self, x: f64) -> bool {
        match self.goal {
            Goal::AtLeast => x >= self.value,
            Goal::AtMost => x <= self.value,
        }
    }

    fn describe(&self, unit: &str) -> String {
        let op = match self.goal {
            Goal::AtLeast => ">=",
            Goal::AtMost => "<=",
        };
        format!("{op} {}", format_value(self.value, unit))
    }
}

/// One metric measured by one run of a workload.
#[derive(Debug, Clone)]
pub struct Sample {
    pub workload: &'static str,
    pub metric: String,
    pub unit: &'static str,
    pub value: f64,
    pub target: Option<Target>,
}

impl Sample {
    pub fn new(
        workload: &'static str,
        metric: impl Into<String>,
        unit: &'static str,
        value: f64,
        target: Option<Target>,
    ) -> Sample {
        Sample {
            workload,
            metric: metric.into(),
            unit,
            value,
            target,
        }
    }
}

/// A metric over all runs: the median is what the table shows and the target judges.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: &'static str,
    pub metric: String,
    pub unit: &'static str,
    pub median: f64,
    pub runs: Vec<f64>,
    pub target: Option<Target>,
    /// `pass` or `miss` against the target, `info` when the metric has none.
    pub status: &'static str,
}

/// The nearest-rank percentile of sorted values (NaN when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median (the mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if !n.is_multiple_of(2) {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Groups samples by (workload, metric) in order of first appearance.
pub fn aggregate(samples: &[Sample]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for s in samples {
        match rows
            .iter_mut()
            .find(|r| r.workload == s.workload && r.metric == s.metric)
        {
            Some(row) => row.runs.push(s.value),
            None => rows.push(Row {
                workload: s.workload,
                metric: s.metric.clone(),
                unit: s.unit,
                median: f64::NAN,
                runs: vec![s.value],
                target: s.target,
                status: "info",
            }),
        }
    }
    for row in &mut rows {
        row.median = median(&row.runs);
        row.status = match row.target {
            Some(t) if t.met_by(row.median) => "pass",
            Some(_) => "miss",
            None => "info",
        };
    }
    rows
}

/// A number in its unit, readable: thousands separators for rates, fixed decimals otherwise.
pub fn format_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    match unit {
        "tasks/s" | "tasks" | "lines" | "batches" => {
            format!("{} {unit}", thousands(v.round() as i64))
        }
        "ms" => format!("{v:.2} ms"),
        "MB" => format!("{v:.1} MB"),
        "s" => format!("{v:.2} s"),
        "cores" => format!("{v:.2} cores"),
        "per task" => format!("{v:.2} per task"),
        "µs" => format!("{v:.1} µs"),
        "×" => format!("{v:.2}×"),
        _ => format!("{v:.3} {unit}"),
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// The table: one line per metric, with the runs when there is more than one.
pub fn render_table(rows: &[Row], errors: &[String], repeat: usize) -> String {
    let head = [
        "workload",
        "metric",
        if repeat > 1 { "median" } else { "result" },
        "target",
        "status",
    ];
    let mut lines: Vec<[String; 5]> = vec![head.map(str::to_owned)];
    for r in rows {
        lines.push([
            r.workload.to_owned(),
            r.metric.clone(),
            format_value(r.median, r.unit),
            r.target.map(|t| t.describe(r.unit)).unwrap_or_default(),
            r.status.to_owned(),
        ]);
    }
    let mut width = [0usize; 5];
    for line in &lines {
        for (w, cell) in width.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let mut text = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}",
            line[0],
            line[1],
            line[2],
            line[3],
            line[4],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
        );
        if i > 0 && repeat > 1 {
            let runs: Vec<String> = rows[i - 1]
                .runs
                .iter()
                .map(|v| format_value(*v, "").trim().to_owned())
                .collect();
            text.push_str(&format!("  runs: {}", runs.join(", ")));
        }
        out.push_str(text.trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&"-".repeat(width.iter().sum::<usize>() + 14));
            out.push('\n');
        }
    }
    for e in errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

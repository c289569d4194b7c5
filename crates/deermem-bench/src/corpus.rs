//! The benchmark data: a corpus of facts (JSON lines `{"user", "agent", "content", "category",
//! "confidence"}`, `agent` null for the default bucket) and a list of queries (one per line).
//! Without files the bench generates both with a fixed seed; `--write-corpus` and
//! `--write-queries` save them so another implementation can be measured on identical data.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use deermem_core::{FactDraft, FactSource};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// The seed of the generated data.
pub const SEED: u64 = 0x00de_e7be;

/// One fact of the corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct CorpusFact {
    /// The raw user id.
    pub user: String,
    /// The agent bucket; `None` is the default bucket.
    pub agent: Option<String>,
    /// The fact text.
    pub content: String,
    /// The category.
    pub category: String,
    /// Confidence in `[0, 1]`.
    pub confidence: f64,
}

impl CorpusFact {
    /// The JSON-lines form.
    pub fn to_json(&self) -> Value {
        json!({
            "user": self.user,
            "agent": self.agent,
            "content": self.content,
            "category": self.category,
            "confidence": self.confidence,
        })
    }

    /// A storage draft of the fact (no id: storage assigns one).
    ///
    /// # Errors
    /// Blank content or a confidence outside `[0, 1]`.
    pub fn draft(&self) -> Result<FactDraft> {
        Ok(FactDraft::new(&self.content)?
            .with_category(self.category.clone())
            .with_confidence(self.confidence)?
            .with_source(FactSource::import()))
    }

    /// The scope key `(user, agent)`.
    pub fn scope_key(&self) -> ScopeKey {
        (self.user.clone(), self.agent.clone())
    }
}

fn parse_line(line: &str, n: usize) -> Result<CorpusFact> {
    let v: Value =
        serde_json::from_str(line).with_context(|| format!("corpus line {n}: not JSON"))?;
    let Value::Object(m) = v else {
        bail!("corpus line {n}: not a JSON object");
    };
    let text = |k: &str| -> Result<String> {
        match m.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => bail!("corpus line {n}: `{k}` must be a string"),
        }
    };
    let agent = match m.get("agent") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => bail!("corpus line {n}: `agent` must be a string or null"),
    };
    let category = match m.get("category") {
        None | Some(Value::Null) => "context".to_owned(),
        Some(_) => text("category")?,
    };
    let confidence = match m.get("confidence") {
        None | Some(Value::Null) => 0.8,
        Some(v) => v
            .as_f64()
            .filter(|c| (0.0..=1.0).contains(c))
            .with_context(|| format!("corpus line {n}: `confidence` must be a number in [0, 1]"))?,
    };
    Ok(CorpusFact {
        user: text("user")?,
        agent,
        content: text("content")?,
        category,
        confidence,
    })
}

/// Reads a JSON-lines corpus (blank lines are skipped).
///
/// # Errors
/// An unreadable file or a malformed line (named by number).
pub fn load_corpus(path: &Path) -> Result<Vec<CorpusFact>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_line(&line, i + 1)?);
    }
    if out.is_empty() {
        bail!("{} holds no facts", path.display());
    }
    Ok(out)
}

/// Reads one query per non-blank line.
///
/// # Errors
/// An unreadable or empty file.
pub fn load_queries(path: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let out: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    if out.is_empty() {
        bail!("{} holds no queries", path.display());
    }
    Ok(out)
}

/// Writes a corpus as JSON lines.
///
/// # Errors
/// I/O failures.
pub fn write_corpus(path: &Path, facts: &[CorpusFact]) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for fact in facts {
        writeln!(f, "{}", fact.to_json())?;
    }
    f.flush()?;
    Ok(())
}

/// Writes queries one per line (line breaks inside a query become spaces).
///
/// # Errors
/// I/O failures.
pub fn write_queries(path: &Path, queries: &[String]) -> Result<()> {
    let text: String = queries
        .iter()
        .map(|q| format!("{}\n", q.replace(['\n', '\r'], " ")))
        .collect();
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "da", "gu", "he", "ji", "ko", "ma",
    "ni", "ok", "pe", "qu", "ra", "su", "te", "ul",
];
const TEMPLATES: [&str; 8] = [
    "User prefers {} when working on {} and keeps notes about {}",
    "User is building {} with {} for the {} team",
    "User wants answers about {} to mention {} before {}",
    "Deadline for {} moved; the {} review happens after {}",
    "User avoids {} and chooses {} over {}",
    "User lives near {} and commutes by {} to {}",
    "Project {} depends on {} and ships with {}",
    "User asked to remember that {} means {} in {}",
];
const CATEGORIES: [&str; 8] = [
    "preference",
    "context",
    "goal",
    "behavior",
    "identity",
    "constraint",
    "decision",
    "correction",
];

fn vocabulary(rng: &mut StdRng, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let k = rng.random_range(2..5);
            (0..k)
                .map(|_| SYLLABLES[rng.random_range(0..SYLLABLES.len())])
                .collect::<String>()
        })
        .collect()
}

/// A word index skewed towards frequent words (roughly Zipfian).
fn zipf(rng: &mut StdRng, n: usize) -> usize {
    let u: f64 = rng.random_range(0.0..1.0);
    ((n as f64).powf(u) as usize).saturating_sub(1).min(n - 1)
}

/// The user ids of generated scopes: scope `i` is user `i / 2`, in the default bucket for even
/// `i` and the `researcher` agent for odd `i`.
pub fn generated_scope(i: usize) -> ScopeKey {
    let user = format!("user{:04}@bench.example", i / 2);
    let agent = (i % 2 == 1).then(|| "researcher".to_owned());
    (user, agent)
}

/// The generator's state: its random source and its vocabulary.
#[derive(Debug)]
pub struct Generator {
    rng: StdRng,
    vocab: Vec<String>,
}

impl Generator {
    /// A generator seeded with `seed` (its vocabulary drawn from the same source).
    pub fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let vocab = vocabulary(&mut rng, 4_000);
        Self { rng, vocab }
    }

    /// The same vocabulary with another random source (so the facts of one user can be made
    /// again from its own seed, independently of every other user's).
    pub fn reseeded(&self, seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            vocab: self.vocab.clone(),
        }
    }

    /// The next fact of a scope.
    pub fn fact(&mut self, user: String, agent: Option<String>) -> CorpusFact {
        let rng = &mut self.rng;
        let template = TEMPLATES[rng.random_range(0..TEMPLATES.len())];
        let mut content = String::new();
        for (k, part) in template.split("{}").enumerate() {
            if k > 0 {
                content.push_str(&self.vocab[zipf(rng, self.vocab.len())]);
            }
            content.push_str(part);
        }
        CorpusFact {
            user,
            agent,
            content,
            category: CATEGORIES[rng.random_range(0..CATEGORIES.len())].to_owned(),
            confidence: (rng.random_range(50..=100) as f64) / 100.0,
        }
    }
}

/// A generated corpus: `facts` facts spread evenly over `scopes` scopes.
pub fn generate_corpus(facts: usize, scopes: usize, seed: u64) -> Vec<CorpusFact> {
    let mut generator = Generator::new(seed);
    let scopes = scopes.max(1);
    (0..facts)
        .map(|i| {
            let (user, agent) = generated_scope(i % scopes);
            generator.fact(user, agent)
        })
        .collect()
}

/// One to three words (longer than three letters) of `content`, or the whole text when it
/// has none: the shape of every generated query.
pub fn query_from(content: &str, rng: &mut StdRng) -> String {
    let words: Vec<&str> = content.split_whitespace().filter(|w| w.len() > 3).collect();
    if words.is_empty() {
        return content.to_owned();
    }
    let k = rng.random_range(1..=3.min(words.len()));
    (0..k)
        .map(|_| words[rng.random_range(0..words.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A scope of the corpus: `(user, agent)`.
pub type ScopeKey = (String, Option<String>);

/// The corpus grouped by scope, in first-seen order of the scopes.
pub fn by_scope(facts: &[CorpusFact]) -> Vec<(ScopeKey, Vec<&CorpusFact>)> {
    let mut order: Vec<ScopeKey> = Vec::new();
    let mut groups: BTreeMap<ScopeKey, Vec<&CorpusFact>> = BTreeMap::new();
    for f in facts {
        let key = f.scope_key();
        let entry = groups.entry(key.clone()).or_default();
        if entry.is_empty() {
            order.push(key);
        }
        entry.push(f);
    }
    order
        .into_iter()
        .map(|k| {
            let v = groups.remove(&k).unwrap_or_default();
            (k, v)
        })
        .collect()
}

/// Generated queries: query `i` is meant for scope `i % scopes` (the search workload assigns
/// scopes the same way for query files) and takes one to three words of one of its facts.
pub fn generate_queries(facts: &[CorpusFact], n: usize, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let groups = by_scope(facts);
    if groups.is_empty() {
        return Vec::new();
    }
    (0..n)
        .map(|i| {
            let (_, scope_facts) = &groups[i % groups.len()];
            let fact = scope_facts[rng.random_range(0..scope_facts.len())];
            query_from(&fact.content, &mut rng)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_spread_over_scopes() {
        let a = generate_corpus(400, 4, SEED);
        let b = generate_corpus(400, 4, SEED);
        assert_eq!(a, b);
        let groups = by_scope(&a);
        assert_eq!(groups.len(), 4);
        assert!(groups.iter().all(|(_, v)| v.len() == 100));
        assert_eq!(groups[0].0.1, None);
        assert_eq!(groups[1].0.1.as_deref(), Some("researcher"));
        let q = generate_queries(&a, 10, SEED);
        assert_eq!(q, generate_queries(&b, 10, SEED));
        assert!(q.iter().all(|q| !q.trim().is_empty()));
    }

    #[test]
    fn files_round_trip_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let facts = generate_corpus(6, 3, 1);
        let path = dir.path().join("c.jsonl");
        write_corpus(&path, &facts).unwrap();
        assert_eq!(load_corpus(&path).unwrap(), facts);
        let qpath = dir.path().join("q.txt");
        write_queries(&qpath, &["a b".into(), "c\nd".into()]).unwrap();
        assert_eq!(load_queries(&qpath).unwrap(), vec!["a b", "c d"]);
        std::fs::write(&path, "{\"user\": \"u\", \"content\": \"x\"}\n\n[1]\n").unwrap();
        let err = load_corpus(&path).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
        std::fs::write(
            &path,
            "{\"user\": \"u\", \"content\": \"x\", \"confidence\": 3}\n",
        )
        .unwrap();
        assert!(load_corpus(&path).is_err());
        std::fs::write(
            &path,
            "{\"user\": \"u\", \"agent\": null, \"content\": \"x\"}\n",
        )
        .unwrap();
        let one = load_corpus(&path).unwrap();
        assert_eq!(
            (one[0].agent.clone(), one[0].category.as_str()),
            (None, "context")
        );
    }
}

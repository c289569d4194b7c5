//! Full-text search in PostgreSQL, shared by the storage's `ScopedSearch` (over `facts`) and
//! the retrieval port (over `search_docs`), so that a query finds what the FTS5 adapter finds.
//!
//! - **Indexing.** Every write stores `search_text`: the content's words as SQLite's
//!   `unicode61` makes them, then its CJK runs as bigrams (the core's shared text rule,
//!   `deermem_core::policy::text`), space separated; the generated `tsv` column is
//!   `to_tsvector('simple', search_text)` under a GIN index. Each token is already one folded
//!   word, so the `simple` configuration only has to split on the spaces.
//! - **Queries.** The shared rule's terms (words, CJK bigram phrases, single-character CJK
//!   prefixes), OR'ed, become one `to_tsquery('simple', $n)` text of single-quoted lexemes
//!   joined by `<->` (phrases), `:*` (prefixes) and `|`. The text is a bind parameter; the
//!   lexemes hold only letters, digits and CJK characters, and are quoted with `'` doubled and
//!   `\` escaped all the same. The query text never becomes SQL.
//! - **Ranking.** FTS5's BM25 (the core's `rank::bm25_term`), computed here over the scope: its
//!   document count and token total come from a query pipelined with the candidates', each
//!   candidate's term frequencies from its `search_text`; then the reference's decay and
//!   confidence, `4 * top_k` per scope, the category filter before the cut, equal relevance
//!   ordered by id. The candidates are every match of the scope up to [`MAX_CANDIDATES`] (a
//!   scope with more is asked again for that many pre-ordered by `ts_rank_cd`, so the BM25
//!   order is exact whenever a scope has at most that many matches). Each term's document
//!   frequency is counted from the candidates when they are every match of the scope; when a
//!   category filter or the cap left some out the scope is asked (one more round trip).
//!   Counting per term in SQL went through the GIN index, which spans every scope: 1–1.4 ms
//!   for a word common to the table however small the scope.

use deermem_core::Fact;
use deermem_core::policy::text::rank;
use deermem_core::policy::text::terms::{NoSegmenter, TermMatch, plain_terms};
use deermem_core::policy::text::tokens::{self, count_matches};
use deermem_core::{MatchType, SearchHit, Timestamp};

/// PostgreSQL's longest lexeme in bytes: a longer word is not indexed, so a term holding one
/// cannot match and is left out of the query.
pub(crate) const MAX_LEXEME_BYTES: usize = 2047;

/// Longest phrase (in words) searched: PostgreSQL records word positions up to 16,383 and
/// refuses very large queries, and no fact holds a phrase this long verbatim.
pub(crate) const MAX_PHRASE_WORDS: usize = 256;

/// Most matches of one scope that are ranked by BM25 (pre-selected by `ts_rank_cd`).
pub(crate) const MAX_CANDIDATES: usize = 1000;

/// What a fact stores for search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Indexed {
    /// The category a search filters on.
    pub(crate) category: String,
    /// The indexed tokens, space separated.
    pub(crate) text: String,
    /// How many tokens `text` holds.
    pub(crate) tokens: i32,
}

/// The search columns of a fact.
pub(crate) fn indexed(fact: &Fact) -> Indexed {
    let (text, n) = tokens::index_text(&fact.content);
    Indexed {
        category: fact.category_or_default().to_owned(),
        text,
        tokens: i32::try_from(n).unwrap_or(i32::MAX),
    }
}

/// One searched term.
#[derive(Clone, Debug)]
struct PlannedTerm {
    matcher: TermMatch,
    cjk: bool,
    /// The term as a `tsquery` operand.
    operand: String,
}

/// A query ready to run.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    terms: Vec<PlannedTerm>,
    has_cjk: bool,
    /// Every term's operand, OR'ed.
    tsquery: String,
}

/// One lexeme as a quoted `tsquery` operand.
fn lexeme(word: &str) -> String {
    format!("'{}'", word.replace('\\', "\\\\").replace('\'', "''"))
}

fn operand(m: &TermMatch) -> String {
    match m {
        TermMatch::Prefix(p) => format!("{}:*", lexeme(p)),
        TermMatch::Phrase(words) => {
            let joined = words
                .iter()
                .map(|w| lexeme(w))
                .collect::<Vec<_>>()
                .join(" <-> ");
            format!("({joined})")
        }
    }
}

fn fits(m: &TermMatch) -> bool {
    match m {
        TermMatch::Prefix(p) => p.len() <= MAX_LEXEME_BYTES,
        TermMatch::Phrase(words) => {
            words.len() <= MAX_PHRASE_WORDS && words.iter().all(|w| w.len() <= MAX_LEXEME_BYTES)
        }
    }
}

/// Plans a query text: `None` when it holds no indexable term (blank, punctuation only, or
/// only words too long to index or phrases longer than [`MAX_PHRASE_WORDS`]). NUL characters separate words, as in the FTS5 adapter.
pub(crate) fn plan(text: &str) -> Option<Plan> {
    let cleaned = text.replace('\0', " ");
    let mut terms = Vec::new();
    for term in plain_terms(&cleaned, &NoSegmenter) {
        let Some(matcher) = term.matcher() else {
            continue;
        };
        if !fits(&matcher) {
            continue;
        }
        terms.push(PlannedTerm {
            operand: operand(&matcher),
            cjk: term.is_cjk(),
            matcher,
        });
    }
    if terms.is_empty() {
        return None;
    }
    let tsquery = terms
        .iter()
        .map(|t| t.operand.as_str())
        .collect::<Vec<_>>()
        .join(" | ");
    Some(Plan {
        has_cjk: terms.iter().any(|t| t.cjk),
        terms,
        tsquery,
    })
}

/// The table a search reads, with its statements. The scope is `$1, $2` (bucket and agent for
/// `facts`, JSON texts for `search_docs`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Table {
    /// The storage's facts.
    Facts,
    /// The retrieval port's documents.
    Docs,
}

impl Table {
    /// The table, its scope columns and its id column.
    fn columns(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Self::Facts => ("facts", "bucket", "agent", "id"),
            Self::Docs => ("search_docs", "scope_user", "scope_agent", "fact_id"),
        }
    }

    /// Candidates: key, fact JSON, search text; `$3` the tsquery text, `$4` the limit, `$5`
    /// the category when filtered. `ranked` pre-orders them by `ts_rank_cd` (only needed when
    /// there are more matches than the limit, to keep the likeliest); otherwise they come in
    /// no particular order and are ranked here.
    fn candidates(self, by_category: bool, ranked: bool) -> String {
        let (table, su, sa, id) = self.columns();
        let category = if by_category {
            " AND category = $5"
        } else {
            ""
        };
        let order = if ranked {
            format!(" ORDER BY ts_rank_cd(tsv, to_tsquery('simple', $3)) DESC, {id} COLLATE \"C\"")
        } else {
            String::new()
        };
        format!(
            "SELECT {id}, fact::text, search_text FROM {table} \
             WHERE {su} = $1 AND {sa} = $2 AND tsv @@ to_tsquery('simple', $3){category}\
             {order} LIMIT $4"
        )
    }

    /// The scope's document count and token total.
    fn totals(self) -> &'static str {
        match self {
            Self::Facts => {
                "SELECT count(*), coalesce(sum(search_tokens), 0)::bigint \
                 FROM facts WHERE bucket = $1 AND agent = $2"
            }
            Self::Docs => {
                "SELECT count(*), coalesce(sum(search_tokens), 0)::bigint \
                 FROM search_docs WHERE scope_user = $1 AND scope_agent = $2"
            }
        }
    }

    /// Each term's document frequency in the scope (`$3` the terms' tsquery texts, answered in
    /// order): asked only when the candidates were cut at the limit, since otherwise they are
    /// every match and the frequencies are counted from them.
    fn term_docs(self) -> &'static str {
        match self {
            Self::Facts => {
                "SELECT ARRAY(SELECT (SELECT count(*) FROM facts WHERE bucket = $1 AND agent = $2 \
                 AND tsv @@ to_tsquery('simple', q.text)) \
                 FROM unnest($3::text[]) WITH ORDINALITY AS q(text, n) ORDER BY q.n)"
            }
            Self::Docs => {
                "SELECT ARRAY(SELECT (SELECT count(*) FROM search_docs WHERE scope_user = $1 \
                 AND scope_agent = $2 AND tsv @@ to_tsquery('simple', q.text)) \
                 FROM unnest($3::text[]) WITH ORDINALITY AS q(text, n) ORDER BY q.n)"
            }
        }
    }
}

/// A matching document of one scope with its BM25 relevance.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    /// The stored fact id.
    pub(crate) id: String,
    /// The stored fact (JSON text).
    pub(crate) fact: String,
    /// `-bm25`, as FTS5 reports it.
    pub(crate) rel: f64,
    /// Only CJK terms matched.
    pub(crate) cjk_only: bool,
}

/// One scope's candidates (see [`Table::candidates`]).
async fn fetch(
    client: &deadpool_postgres::ClientWrapper,
    table: Table,
    plan: &Plan,
    (user, agent): (&str, &str),
    category: Option<&str>,
    ranked: bool,
    limit: i64,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let stmt = client
        .prepare_cached(&table.candidates(category.is_some(), ranked))
        .await?;
    match category {
        Some(c) => {
            client
                .query(&stmt, &[&user, &agent, &plan.tsquery, &limit, &c])
                .await
        }
        None => {
            client
                .query(&stmt, &[&user, &agent, &plan.tsquery, &limit])
                .await
        }
    }
}

/// The best `2 * per_scope` matches of one scope by BM25 (FTS5's candidate window), best
/// first.
pub(crate) async fn scope_candidates(
    client: &deadpool_postgres::ClientWrapper,
    table: Table,
    scope: (&str, &str),
    plan: &Plan,
    category: Option<&str>,
    per_scope: usize,
) -> Result<Vec<Candidate>, tokio_postgres::Error> {
    let window = per_scope.saturating_mul(2);
    let limit = i64::try_from(window.max(MAX_CANDIDATES)).unwrap_or(i64::MAX);
    let (user, agent) = scope;
    // Statements prepared once per pooled connection; the candidates (one more than the
    // limit, which tells whether the matches were cut) and the scope's totals are asked for
    // together (the driver pipelines them on the connection), so a search costs one round
    // trip unless the scope has more matches than the limit.
    let candidates = fetch(
        client,
        table,
        plan,
        scope,
        category,
        false,
        limit.saturating_add(1),
    );
    let totals = async {
        let stmt = client.prepare_cached(table.totals()).await?;
        client.query_one(&stmt, &[&user, &agent]).await
    };
    let (rows, totals) = tokio::join!(candidates, totals);
    let mut rows = rows?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // More matches than the limit: keep the likeliest by PostgreSQL's own ranking.
    let cut = i64::try_from(rows.len()).unwrap_or(i64::MAX) > limit;
    if cut {
        rows = fetch(client, table, plan, scope, category, true, limit).await?;
    }
    let totals = totals?;
    let docs = u64::try_from(totals.get::<_, i64>(0)).unwrap_or(0);
    let total_tokens: i64 = totals.get(1);
    let avg_len = if docs == 0 {
        0.0
    } else {
        total_tokens as f64 / docs as f64
    };
    // Each candidate's tokens and each term's frequency in it.
    let counted: Vec<(usize, Vec<usize>)> = rows
        .iter()
        .map(|r| {
            let text: &str = r.get(2);
            let toks: Vec<&str> = text.split(' ').filter(|t| !t.is_empty()).collect();
            let freqs = plan
                .terms
                .iter()
                .map(|t| count_matches(&toks, &t.matcher))
                .collect();
            (toks.len(), freqs)
        })
        .collect();
    // Document frequencies: the candidates are every match of the scope unless the limit cut
    // them (filtered by category they are not, so the scope is asked then too).
    let hits: Vec<u64> = if category.is_none() && !cut {
        (0..plan.terms.len())
            .map(|i| counted.iter().filter(|(_, f)| f[i] > 0).count() as u64)
            .collect()
    } else {
        let operands: Vec<&str> = plan.terms.iter().map(|t| t.operand.as_str()).collect();
        let stmt = client.prepare_cached(table.term_docs()).await?;
        let row = client.query_one(&stmt, &[&user, &agent, &operands]).await?;
        row.get::<_, Vec<i64>>(0)
            .into_iter()
            .map(|h| u64::try_from(h).unwrap_or(0))
            .collect()
    };
    let idf: Vec<f64> = (0..plan.terms.len())
        .map(|i| rank::bm25_idf(docs, hits.get(i).copied().unwrap_or(0)))
        .collect();
    let mut out: Vec<Candidate> = rows
        .iter()
        .zip(&counted)
        .map(|(r, (len, freqs))| {
            let mut rel = 0.0;
            let mut word_hit = false;
            for ((term, idf), &f) in plan.terms.iter().zip(&idf).zip(freqs) {
                if f > 0 && !term.cjk {
                    word_hit = true;
                }
                rel += rank::bm25_term(*idf, f, *len, avg_len);
            }
            Candidate {
                id: r.get(0),
                fact: r.get(1),
                rel,
                cjk_only: plan.has_cjk && !word_hit,
            }
        })
        .collect();
    // Equal relevance: by id, so the order does not depend on how the rows came.
    out.sort_by(|a, b| b.rel.total_cmp(&a.rel).then_with(|| a.id.cmp(&b.id)));
    out.truncate(window);
    Ok(out)
}

/// A candidate with its decoded fact and final score.
#[derive(Clone, Debug)]
pub(crate) struct Scored {
    pub(crate) fact: Fact,
    pub(crate) score: f64,
    pub(crate) rel: f64,
    pub(crate) cjk_only: bool,
}

impl Scored {
    /// The reference's final score of a candidate: relevance with decay on `createdAt`, plus
    /// the weighted confidence.
    pub(crate) fn new(c: &Candidate, fact: Fact, now: Timestamp) -> Self {
        let decay = rank::decay(now, rank::created_micros(&fact.created_at));
        let score = rank::final_score(c.rel, decay, rank::index_confidence(&fact));
        Self {
            fact,
            score,
            rel: c.rel,
            cjk_only: c.cjk_only,
        }
    }
}

/// One scope's scored candidates cut to `per_scope`, best first (stable).
pub(crate) fn cut_scope(mut scored: Vec<Scored>, per_scope: usize) -> Vec<Scored> {
    scored.sort_by(|a, b| b.score.total_cmp(&a.score));
    scored.truncate(per_scope);
    scored
}

/// Every scope's candidates merged: the best `top_k` as hits.
pub(crate) fn finish(mut all: Vec<Scored>, top_k: usize) -> Vec<SearchHit> {
    all.sort_by(|a, b| b.score.total_cmp(&a.score));
    all.truncate(top_k);
    all.into_iter()
        .map(|s| SearchHit {
            fact: s.fact,
            score: s.score,
            match_type: if s.cjk_only {
                MatchType::Cjk
            } else {
                MatchType::Fts5
            },
            bm25: Some(s.rel),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_quote_every_lexeme() {
        let p = plan("Real-time it's 乌龙茶 茶 !!!").unwrap();
        assert_eq!(
            p.tsquery,
            "('real' <-> 'time') | ('it' <-> 's') | ('乌龙' <-> '龙茶') | ('乌龙') | ('龙茶') \
             | '茶':*"
        );
        assert!(p.has_cjk);
        assert_eq!(lexeme("a'b\\c"), "'a''b\\\\c'");
    }

    #[test]
    fn queries_without_indexable_terms_have_no_plan() {
        for q in ["", "   ", "!!!", "'; --", "\0", "%_", "$$ :* &|!()"] {
            assert!(plan(q).is_none(), "{q:?}");
        }
        assert!(plan(&"x".repeat(MAX_LEXEME_BYTES + 1)).is_none());
        assert!(plan(&"x".repeat(MAX_LEXEME_BYTES)).is_some());
        assert!(plan(&"a-".repeat(MAX_PHRASE_WORDS + 1)).is_none());
        assert!(plan(&"a-".repeat(MAX_PHRASE_WORDS)).is_some());
        // NUL separates words, as in the FTS5 adapter.
        assert_eq!(plan("a\0b").unwrap().tsquery, "('a') | ('b')");
    }
}

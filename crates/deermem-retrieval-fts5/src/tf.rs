//! BM25 over the searched scope: the FTS5 auxiliary function `deermem_tf` that reports, for
//! each matched row, the shard's row and token totals, the row's length and each query
//! phrase's hits per column, and [`ScopeBm25`], which scores a scope's matches from them with
//! FTS5's own `bm25()` formula but with the document count and the document frequencies taken
//! from the scope instead of the whole shard.
//!
//! FTS5's `bm25()` counts, on its first call in a statement, the rows of the *whole table*
//! holding each phrase (one pass over the phrase's doclist per search). A shard holds many
//! scopes, so that pass grows with the store while the scope searched stays the same size.
//! A plain query is an OR of its words, so every row of the scope holding a word is a match:
//! counting the matches that hold each phrase gives the scope's document frequencies exactly,
//! with no pass over the other scopes' rows. When the shard holds only the searched scope the
//! score is `-bm25()` to the last bit (`tests::equals_fts5_bm25_when_the_shard_is_the_scope`).

use std::ffi::{CStr, c_int, c_void};

use rusqlite::Connection;
use rusqlite::ffi;

/// The function's SQL name.
pub(crate) const NAME: &str = "deermem_tf";
const NAME_C: &CStr = c"deermem_tf";

/// Registers `deermem_tf` on a connection (each connection has its own function table).
///
/// # Errors
/// When the connection has no FTS5 or the registration is refused.
pub(crate) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let api = fts5_api(conn)?;
    // SAFETY: `api` is the connection's FTS5 API object, valid while the connection is open
    // (SQLite owns it); the name is a NUL-terminated static string that FTS5 copies; the
    // function takes no user data and so needs no destructor.
    let rc = unsafe {
        match (*api).xCreateFunction {
            Some(create) => create(
                api,
                NAME_C.as_ptr(),
                std::ptr::null_mut(),
                Some(tf_function),
                None,
            ),
            None => ffi::SQLITE_MISUSE,
        }
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(rc),
            Some(format!("cannot register the FTS5 function {NAME}")),
        ))
    }
}

/// The connection's `fts5_api` pointer, as SQLite documents it: `SELECT fts5(?1)` with a
/// pointer bound under the type name `fts5_api_ptr`.
fn fts5_api(conn: &Connection) -> rusqlite::Result<*mut ffi::fts5_api> {
    let mut api: *mut ffi::fts5_api = std::ptr::null_mut();
    let mut stmt: *mut ffi::sqlite3_stmt = std::ptr::null_mut();
    // SAFETY: the handle is the open connection's; the statement is prepared, stepped and
    // finalized here on this thread; the bound pointer points at `api`, which outlives the
    // statement, and the type name is a static NUL-terminated string, as the interface asks.
    // SQLite's message is read before anything else runs on the connection.
    let (rc, message) = unsafe {
        let db = conn.handle();
        let mut rc = ffi::sqlite3_prepare_v2(
            db,
            c"SELECT fts5(?1)".as_ptr(),
            -1,
            &raw mut stmt,
            std::ptr::null_mut(),
        );
        if rc == ffi::SQLITE_OK {
            rc = ffi::sqlite3_bind_pointer(
                stmt,
                1,
                (&raw mut api).cast::<c_void>(),
                c"fts5_api_ptr".as_ptr(),
                None,
            );
        }
        if rc == ffi::SQLITE_OK {
            rc = ffi::sqlite3_step(stmt);
            if rc == ffi::SQLITE_ROW || rc == ffi::SQLITE_DONE {
                rc = ffi::SQLITE_OK;
            }
        }
        let message = (rc != ffi::SQLITE_OK).then(|| {
            CStr::from_ptr(ffi::sqlite3_errmsg(db))
                .to_string_lossy()
                .into_owned()
        });
        ffi::sqlite3_finalize(stmt);
        (rc, message)
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message));
    }
    if api.is_null() {
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_ERROR),
            Some("this SQLite has no FTS5 API".to_owned()),
        ));
    }
    Ok(api)
}

/// Columns of a shard (`content`, `cjk`).
pub(crate) const COLUMNS: usize = 2;

/// `deermem_tf(fts)`: a blob of little-endian `i64`s, `[shard rows, shard tokens, row tokens,
/// phrases, then per phrase its hits in each of the shard's columns]`.
unsafe extern "C" fn tf_function(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    _n_val: c_int,
    _values: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: FTS5 calls this with its API object and the current row's context, both valid
    // for the call; every API function used is one FTS5 documents for auxiliary functions.
    let out = unsafe { row_stats(&*api, fts) };
    // SAFETY: `ctx` is the call's result context; the blob is copied by SQLite
    // (SQLITE_TRANSIENT) before this returns.
    unsafe {
        match out {
            Ok(words) => {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                match c_int::try_from(bytes.len()) {
                    Ok(n) => ffi::sqlite3_result_blob(
                        ctx,
                        bytes.as_ptr().cast::<c_void>(),
                        n,
                        ffi::SQLITE_TRANSIENT(),
                    ),
                    Err(_) => ffi::sqlite3_result_error_toobig(ctx),
                }
            }
            Err(rc) => ffi::sqlite3_result_error_code(ctx, rc),
        }
    }
}

/// The figures of the current row (see [`tf_function`]), or the failing SQLite code.
///
/// # Safety
/// `api` and `fts` must be the arguments FTS5 passed to the auxiliary function.
unsafe fn row_stats(
    api: &ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
) -> Result<Vec<i64>, c_int> {
    let missing = ffi::SQLITE_MISUSE;
    let check = |rc: c_int| {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    };
    let (mut rows, mut tokens, mut len, mut inst) = (0i64, 0i64, 0 as c_int, 0 as c_int);
    // SAFETY: the caller passes FTS5's own API object and context.
    unsafe {
        check(api.xRowCount.ok_or(missing)?(fts, &raw mut rows))?;
        check(api.xColumnTotalSize.ok_or(missing)?(
            fts,
            -1,
            &raw mut tokens,
        ))?;
        check(api.xColumnSize.ok_or(missing)?(fts, -1, &raw mut len))?;
        let phrases = api.xPhraseCount.ok_or(missing)?(fts);
        let phrases = usize::try_from(phrases).map_err(|_| ffi::SQLITE_ERROR)?;
        let mut out = Vec::with_capacity(4 + phrases * COLUMNS);
        out.extend([rows, tokens, i64::from(len), phrases as i64]);
        out.resize(4 + phrases * COLUMNS, 0);
        check(api.xInstCount.ok_or(missing)?(fts, &raw mut inst))?;
        let x_inst = api.xInst.ok_or(missing)?;
        for i in 0..inst {
            let (mut phrase, mut col, mut off) = (0 as c_int, 0 as c_int, 0 as c_int);
            check(x_inst(fts, i, &raw mut phrase, &raw mut col, &raw mut off))?;
            let (Ok(p), Ok(c)) = (usize::try_from(phrase), usize::try_from(col)) else {
                continue;
            };
            if p < phrases
                && c < COLUMNS
                && let Some(slot) = out.get_mut(4 + p * COLUMNS + c)
            {
                *slot += 1;
            }
        }
        Ok(out)
    }
}

/// One matched row's figures, decoded from `deermem_tf`'s blob.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RowTf {
    /// Rows of the shard (FTS5's `xRowCount`).
    pub shard_rows: i64,
    /// Tokens of the shard, all columns.
    pub shard_tokens: i64,
    /// Tokens of the row, all columns.
    pub len: i64,
    /// Hits per phrase, per column.
    pub hits: Vec<[i64; COLUMNS]>,
}

impl RowTf {
    /// Decodes the blob; `None` when it is not one `deermem_tf` writes.
    pub(crate) fn decode(blob: &[u8]) -> Option<Self> {
        if !blob.len().is_multiple_of(8) {
            return None;
        }
        let words: Vec<i64> = blob
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                i64::from_le_bytes(b)
            })
            .collect();
        let (&[rows, tokens, len, phrases], rest) = words.split_first_chunk::<4>()?;
        let phrases = usize::try_from(phrases).ok()?;
        if rest.len() != phrases.checked_mul(COLUMNS)? {
            return None;
        }
        let hits = rest.chunks_exact(COLUMNS).map(|c| [c[0], c[1]]).collect();
        Some(Self {
            shard_rows: rows,
            shard_tokens: tokens,
            len,
            hits,
        })
    }

    /// Whether no phrase was found in the `content` column (a match by CJK bigrams only).
    pub(crate) fn body_missed(&self) -> bool {
        self.hits.iter().all(|h| h[0] == 0)
    }
}

/// FTS5's `bm25()` parameters.
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// BM25 of a scope's matches: IDF from the scope's document count and the matches holding
/// each phrase, average length from the shard (as FTS5), column weights 1.
pub(crate) struct ScopeBm25 {
    idf: Vec<f64>,
    avgdl: f64,
}

impl ScopeBm25 {
    /// The statistics of `matches`, all the matches of one plain query in a scope of
    /// `scope_docs` documents.
    pub(crate) fn new(scope_docs: i64, matches: &[&RowTf]) -> Self {
        let phrases = matches.iter().map(|m| m.hits.len()).max().unwrap_or(0);
        let n = scope_docs.max(1);
        let idf = (0..phrases)
            .map(|p| {
                let hit = matches
                    .iter()
                    .filter(|m| m.hits.get(p).is_some_and(|h| h.iter().sum::<i64>() > 0))
                    .count() as i64;
                let idf = (((n - hit) as f64 + 0.5) / (hit as f64 + 0.5)).ln();
                if idf <= 0.0 { 1e-6 } else { idf }
            })
            .collect();
        let avgdl = matches.first().map_or(1.0, |m| {
            if m.shard_rows > 0 {
                m.shard_tokens as f64 / m.shard_rows as f64
            } else {
                1.0
            }
        });
        Self { idf, avgdl }
    }

    /// The relevance of one match (FTS5's `-bm25()` with the scope's statistics).
    pub(crate) fn relevance(&self, m: &RowTf) -> f64 {
        let d = m.len as f64;
        let mut score = 0.0;
        for (p, idf) in self.idf.iter().enumerate() {
            let freq = m
                .hits
                .get(p)
                .map_or(0.0, |h| h.iter().map(|&x| x as f64).sum::<f64>());
            score += idf * ((freq * (K1 + 1.0)) / (freq + K1 * (1.0 - B + B * d / self.avgdl)));
        }
        score
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(conn: &Connection) {
        conn.execute_batch(
            "CREATE VIRTUAL TABLE f USING fts5(content, cjk, content='', contentless_delete=1, \
             tokenize='unicode61');",
        )
        .unwrap();
    }

    fn insert(conn: &Connection, rowid: i64, content: &str, cjk: &str) {
        conn.execute(
            "INSERT INTO f(rowid, content, cjk) VALUES (?1, ?2, ?3)",
            rusqlite::params![rowid, content, cjk],
        )
        .unwrap();
    }

    /// (rowid, FTS5's -bm25, ours) for every match of `expr` within `lo..=hi`.
    fn both(conn: &Connection, expr: &str, lo: i64, hi: i64) -> Vec<(i64, f64, f64)> {
        let mut stmt = conn
            .prepare(
                "SELECT rowid, -bm25(f), deermem_tf(f) FROM f WHERE f MATCH ?1 \
                 AND rowid BETWEEN ?2 AND ?3 ORDER BY rowid",
            )
            .unwrap();
        let rows: Vec<(i64, f64, RowTf)> = stmt
            .query_map(rusqlite::params![expr, lo, hi], |r| {
                let blob: Vec<u8> = r.get(2)?;
                Ok((r.get(0)?, r.get(1)?, RowTf::decode(&blob).unwrap()))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let docs: i64 = conn
            .query_row(
                "SELECT count(*) FROM f_docsize WHERE id BETWEEN ?1 AND ?2",
                [lo, hi],
                |r| r.get(0),
            )
            .unwrap();
        let tfs: Vec<&RowTf> = rows.iter().map(|r| &r.2).collect();
        let bm = ScopeBm25::new(docs, &tfs);
        rows.iter()
            .map(|(id, fts5, tf)| (*id, *fts5, bm.relevance(tf)))
            .collect()
    }

    #[test]
    fn equals_fts5_bm25_when_the_shard_is_the_scope() {
        let conn = Connection::open_in_memory().unwrap();
        register(&conn).unwrap();
        shard(&conn);
        let texts = [
            "prefers oolong tea over coffee in the morning",
            "drinks coffee black",
            "tea tea tea all day long, green tea mostly",
            "lives in lisbon",
            "the morning run is along the river",
            "works as a backend engineer",
        ];
        for (i, t) in texts.iter().enumerate() {
            insert(
                &conn,
                i as i64 + 1,
                t,
                if i == 2 { "乌龙 龙茶" } else { "" },
            );
        }
        for expr in [
            r#""tea""#,
            r#""tea" OR "coffee""#,
            r#""morning" OR "the" OR "lisbon" OR "nothing""#,
            r#""乌龙" OR "tea""#,
        ] {
            let got = both(&conn, expr, 0, 100);
            assert!(!got.is_empty(), "{expr} matches");
            for (id, fts5, ours) in got {
                assert_eq!(
                    fts5.to_bits(),
                    ours.to_bits(),
                    "{expr}: row {id}: {fts5} vs {ours}"
                );
            }
        }
    }

    #[test]
    fn another_scope_in_the_shard_does_not_change_the_scores() {
        let conn = Connection::open_in_memory().unwrap();
        register(&conn).unwrap();
        shard(&conn);
        // Scope A: rowids 1..=3. Scope B (rowids 1000..): "tea" everywhere, which makes the
        // word common in the shard and so worth little to FTS5's whole-table bm25.
        insert(&conn, 1, "likes green tea", "");
        insert(&conn, 2, "likes the sea", "");
        insert(&conn, 3, "owns a boat", "");
        let alone = both(&conn, r#""tea" OR "sea""#, 1, 3);
        for i in 0..20 {
            insert(&conn, 1000 + i, "tea tea and more tea", "");
        }
        let crowded = both(&conn, r#""tea" OR "sea""#, 1, 3);
        assert_eq!(alone.len(), 2);
        assert_eq!(alone.len(), crowded.len());
        // FTS5's own figure moves with the other scope's rows.
        assert_ne!(alone[0].1.to_bits(), crowded[0].1.to_bits());
        // The document frequencies, and so the IDFs, are the scope's: only the average length
        // (the shard's, as FTS5) may move the score, and it moves every row alike.
        let tea_alone = alone[0].2 / alone[1].2;
        let tea_crowded = crowded[0].2 / crowded[1].2;
        assert!(
            (tea_alone - tea_crowded).abs() < 1e-9,
            "{alone:?} {crowded:?}"
        );
    }

    #[test]
    fn a_cjk_only_match_misses_the_body() {
        let conn = Connection::open_in_memory().unwrap();
        register(&conn).unwrap();
        shard(&conn);
        insert(&conn, 1, "tea", "乌龙");
        let mut stmt = conn
            .prepare("SELECT deermem_tf(f) FROM f WHERE f MATCH '\"乌龙\"'")
            .unwrap();
        let blob: Vec<u8> = stmt.query_row([], |r| r.get(0)).unwrap();
        let tf = RowTf::decode(&blob).unwrap();
        assert!(tf.body_missed());
        assert_eq!(tf.hits, vec![[0, 1]]);
        assert_eq!((tf.shard_rows, tf.len), (1, 2));
    }

    #[test]
    fn blobs_of_the_wrong_shape_do_not_decode() {
        assert_eq!(RowTf::decode(&[1, 2, 3]), None);
        assert_eq!(RowTf::decode(&[0; 16]), None);
        let mut words = [1i64, 2, 3, 5]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<_>>();
        assert_eq!(
            RowTf::decode(&words),
            None,
            "5 phrases announced, none given"
        );
        words.extend([0u8; 8 * 10]);
        assert!(RowTf::decode(&words).is_some());
        let huge = [1i64, 2, 3, i64::MAX]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<_>>();
        assert_eq!(RowTf::decode(&huge), None);
    }
}

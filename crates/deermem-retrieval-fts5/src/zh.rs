//! Chinese word segmentation with jieba (feature `zh`): pure-Han query runs are searched as
//! jieba words (each an exact bigram phrase) instead of loose bigrams. Indexing does not depend
//! on it, so an index built with or without the feature is the same.

use std::sync::OnceLock;

use jieba_rs::Jieba;

use crate::cjk;
use crate::query::Segmenter;

fn jieba() -> &'static Jieba {
    static JIEBA: OnceLock<Jieba> = OnceLock::new();
    JIEBA.get_or_init(Jieba::new)
}

/// Segments runs of Han characters with jieba (accurate mode, HMM on, like the reference);
/// runs holding kana or Hangul are left whole.
#[derive(Debug, Clone, Copy, Default)]
pub struct JiebaSegmenter;

impl Segmenter for JiebaSegmenter {
    fn words<'a>(&self, run: &'a str) -> Vec<&'a str> {
        if run.chars().any(cjk::is_kana_or_hangul) {
            return vec![run];
        }
        jieba()
            .cut(run, true)
            .into_iter()
            .filter(|w| !deermem_pycompat::py::strip(w).is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::plain_expression;

    #[test]
    fn segments_chinese_into_words() {
        let words = JiebaSegmenter.words("我喜欢喝乌龙茶");
        assert!(words.contains(&"喜欢"), "{words:?}");
        assert_eq!(words.concat(), "我喜欢喝乌龙茶");
        let e = plain_expression("我喜欢喝乌龙茶", &JiebaSegmenter);
        assert!(e.contains(r#""喜欢""#), "{e}");
        assert_eq!(JiebaSegmenter.words("住んでいる"), vec!["住んでいる"]);
    }
}

//! Rule files: TOML, one `[[rule]]` per pattern, with the attack family it belongs to, the
//! level it proves on its own, its language, and the anchor words that make it worth trying.
//! The built-in file is `rules/default.toml`; operators add their own files without a rebuild.
//!
//! ```toml
//! [[rule]]
//! id = "override.ignore-previous.en"
//! family = "instruction_override"
//! level = "high"
//! lang = "en"
//! anchors = ["ignore", "disregard"]       # any of them must occur in the canonical text
//! pattern = '''(ignore|disregard) (all )?(previous|prior) instructions'''
//! ```

use aho_corasick::AhoCorasick;
use regex::{Regex, RegexBuilder};
use serde::Deserialize;

use crate::{Family, ScannerError, ThreatLevel};

/// How large one rule's compiled pattern may grow.
const PATTERN_SIZE_LIMIT: usize = 8 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    rule: Vec<RuleSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    family: Family,
    level: ThreatLevel,
    #[serde(default)]
    lang: String,
    #[serde(default)]
    anchors: Vec<String>,
    pattern: String,
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Its id, unique over all files.
    pub id: String,
    /// The attack family it finds.
    pub family: Family,
    /// The level a match proves on its own.
    pub level: ThreatLevel,
    /// Its language (`en`, `de`, ...; empty: any).
    pub lang: String,
    pattern: Regex,
}

impl Rule {
    /// Whether the rule matches `text` (a canonical form).
    pub fn matches(&self, text: &str) -> bool {
        self.pattern.is_match(text)
    }
}

/// Every rule, with the anchor automaton that says which to try on a text.
#[derive(Debug, Clone)]
pub struct RuleSet {
    rules: Vec<Rule>,
    /// Rules without anchors: tried on every text.
    always: Vec<usize>,
    anchors: AhoCorasick,
    /// For each anchor pattern, the rules it names.
    anchored: Vec<Vec<usize>>,
}

impl RuleSet {
    /// Compiles the rules of the given files' texts (`(name, text)`), in order.
    ///
    /// # Errors
    /// [`ScannerError::Rules`] naming the file and rule that does not parse or compile, or an
    /// id used twice.
    pub fn compile<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ScannerError> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut anchor_words: Vec<String> = Vec::new();
        let mut anchored: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (name, text) in files {
            let file: RuleFile = toml::from_str(text).map_err(|err| ScannerError::Rules {
                file: name.to_owned(),
                reason: err.to_string(),
            })?;
            for spec in file.rule {
                let fail = |reason: String| ScannerError::Rules {
                    file: name.to_owned(),
                    reason: format!("rule {:?}: {reason}", spec.id),
                };
                if rules.iter().any(|r| r.id == spec.id) {
                    return Err(fail("the id is used twice".into()));
                }
                if spec.level == ThreatLevel::None {
                    return Err(fail("a rule's level must be low or above".into()));
                }
                // A Unicode word boundary keeps the fast engines off any text that is not
                // ASCII; rules mark boundaries of ASCII words only.
                let ascii_boundaries = spec.pattern.replace(r"\b", r"(?-u:\b)");
                let pattern = RegexBuilder::new(&ascii_boundaries)
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .build()
                    .map_err(|err| fail(err.to_string()))?;
                let index = rules.len();
                if spec.anchors.is_empty() {
                    always.push(index);
                }
                for anchor in &spec.anchors {
                    let anchor = crate::normalize::canonical(anchor);
                    if anchor.is_empty() {
                        return Err(fail("an anchor is empty".into()));
                    }
                    match anchor_words.iter().position(|a| *a == anchor) {
                        Some(at) => anchored[at].push(index),
                        None => {
                            anchor_words.push(anchor);
                            anchored.push(vec![index]);
                        }
                    }
                }
                rules.push(Rule {
                    id: spec.id,
                    family: spec.family,
                    level: spec.level,
                    lang: spec.lang,
                    pattern,
                });
            }
        }
        let anchors = AhoCorasick::new(&anchor_words).map_err(|err| ScannerError::Rules {
            file: "(anchors)".into(),
            reason: err.to_string(),
        })?;
        Ok(Self {
            rules,
            always,
            anchors,
            anchored,
        })
    }

    /// The rules worth trying on `text`: those whose anchors occur, and those without any.
    pub fn candidates(&self, text: &str, into: &mut Vec<usize>) {
        into.extend_from_slice(&self.always);
        for found in self.anchors.find_overlapping_iter(text) {
            into.extend_from_slice(&self.anchored[found.pattern().as_usize()]);
        }
        into.sort_unstable();
        into.dedup();
    }

    /// The rule at `index`.
    pub fn rule(&self, index: usize) -> &Rule {
        &self.rules[index]
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The languages the rules cover.
    pub fn languages(&self) -> Vec<&str> {
        let mut langs: Vec<&str> = self.rules.iter().map(|r| r.lang.as_str()).collect();
        langs.sort_unstable();
        langs.dedup();
        langs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_rule_is_named_with_its_file() {
        let bad = r#"
[[rule]]
id = "x"
family = "instruction_override"
level = "high"
pattern = "(unclosed"
"#;
        let err = RuleSet::compile([("extra.toml", bad)]).unwrap_err();
        assert!(err.to_string().contains("extra.toml"), "{err}");
        assert!(err.to_string().contains("\"x\""), "{err}");
        let twice = "[[rule]]\nid='a'\nfamily='encoding'\nlevel='low'\npattern='a'\n";
        let err = RuleSet::compile([("a.toml", twice), ("b.toml", twice)]).unwrap_err();
        assert!(err.to_string().contains("used twice"), "{err}");
    }

    #[test]
    fn only_rules_whose_anchors_occur_are_tried() {
        let file = r#"
[[rule]]
id = "a"
family = "instruction_override"
level = "high"
anchors = ["ignore"]
pattern = "ignore"
[[rule]]
id = "b"
family = "encoding"
level = "low"
pattern = "x"
"#;
        let set = RuleSet::compile([("f", file)]).unwrap();
        let mut found = Vec::new();
        set.candidates("hello", &mut found);
        assert_eq!(found, [1]);
        found.clear();
        set.candidates("please ignore", &mut found);
        assert_eq!(found, [0, 1]);
    }
}

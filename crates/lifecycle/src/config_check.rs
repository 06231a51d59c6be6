//! Refuses names no part of the program reads, each with the valid name closest to it.
//!
//! The valid keys are the union of every registered config type's: one file configures the
//! whole product, so a gateway given the runner's `[runner]` accepts it, and `agentloop all`
//! accepts what any of its services reads. A key is unknown when no type reads it; inside a
//! map of the user's own keys (`[agents.<id>]`) any key is taken and the fields below it are
//! checked.

use std::fmt;

use toml::{Table, Value};

use crate::config_env;
use crate::config_schema::{Schema, Segment, Shape};

/// A name in the configuration that nothing reads, and the valid name closest to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownName {
    /// A key of the config file, as a dotted path (`runner.max_turn`).
    Key {
        /// The key's path.
        path: String,
        /// The closest valid path, when the table has any key.
        closest: Option<String>,
    },
    /// An `AGENTLOOP_*` environment variable.
    Variable {
        /// The variable.
        name: String,
        /// The closest valid variable.
        closest: Option<String>,
    },
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, name, closest) = match self {
            Self::Key { path, closest } => ("key", path, closest),
            Self::Variable { name, closest } => ("environment variable", name, closest),
        };
        write!(f, "unknown {what} `{name}`")?;
        match closest {
            Some(closest) => write!(f, "; did you mean `{closest}`?"),
            None => Ok(()),
        }
    }
}

/// Every unknown name of one load, in the order found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownNames(pub Vec<UnknownName>);

impl fmt::Display for UnknownNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{name}")?;
        }
        Ok(())
    }
}

/// Returns the keys of `file` and the variables among `variables` that none of `schemas` reads.
pub(crate) fn unknown_names<'a>(
    file: &Table,
    variables: impl IntoIterator<Item = &'a str>,
    schemas: &[Schema],
) -> Vec<UnknownName> {
    let mut unknown = Vec::new();
    unknown_keys(file, &mut Vec::new(), schemas, &mut unknown);
    for name in variables {
        let path: Vec<Segment> = match config_env::classify(name) {
            config_env::Variable::Key(keys) => keys.into_iter().map(Segment::Key).collect(),
            config_env::Variable::Unknown => Vec::new(),
            config_env::Variable::Other => continue,
        };
        let known = !path.is_empty() && (1..=path.len()).all(|n| reads(schemas, &path[..n]));
        if !known {
            unknown.push(UnknownName::Variable {
                name: name.to_owned(),
                closest: closest(name, &valid_variables(schemas, &path)),
            });
        }
    }
    unknown
}

/// Walks `table` at `path`, reporting the first unknown key of each branch.
fn unknown_keys(
    table: &Table,
    path: &mut Vec<Segment>,
    schemas: &[Schema],
    out: &mut Vec<UnknownName>,
) {
    for (key, value) in table {
        path.push(Segment::Key(key.clone()));
        if reads(schemas, path) {
            unknown_values(value, path, schemas, out);
        } else {
            let siblings = fields_at(schemas, &path[..path.len() - 1]);
            out.push(UnknownName::Key {
                path: display(path),
                closest: closest(key, &siblings).map(|name| {
                    let mut sibling = path.clone();
                    sibling.pop();
                    sibling.push(Segment::Key(name));
                    display(&sibling)
                }),
            });
        }
        path.pop();
    }
}

fn unknown_values(
    value: &Value,
    path: &mut Vec<Segment>,
    schemas: &[Schema],
    out: &mut Vec<UnknownName>,
) {
    match value {
        Value::Table(table) => unknown_keys(table, path, schemas, out),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Segment::Index(i));
                unknown_values(item, path, schemas, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Returns whether any schema reads the last key of `path`, given its parent.
fn reads(schemas: &[Schema], path: &[Segment]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return true;
    };
    schemas.iter().any(|schema| match schema.shape_at(parent) {
        Shape::Struct(fields) => matches!(last, Segment::Key(k) if fields.contains(&k.as_str())),
        Shape::Map | Shape::Seq | Shape::Opaque => true,
        Shape::Absent => false,
    })
}

/// Returns the field names some schema reads at `path`.
fn fields_at(schemas: &[Schema], path: &[Segment]) -> Vec<String> {
    let mut fields: Vec<String> = schemas
        .iter()
        .filter_map(|schema| match schema.shape_at(path) {
            Shape::Struct(fields) => Some(fields.iter().map(|f| (*f).to_owned())),
            _ => None,
        })
        .flatten()
        .collect();
    fields.sort();
    fields.dedup();
    fields
}

/// How deep the variables offered as the closest valid name go: deep enough for
/// `AGENTLOOP_AGENTS__<ID>__<KEY>` and the tables of a channel, and a bound should a config
/// type ever contain itself.
const SUGGESTION_DEPTH: usize = 4;

/// Returns the variables to suggest for the unknown variable whose key path is `given` (empty
/// when it is no path at all): every `AGENTLOOP_<SECTION>__<KEY>[__<KEY>...]` down struct
/// fields, and the names that are not config. The keys of a map are the user's, so below one
/// the key `given` has at that level is taken, and none is made up when it has none.
fn valid_variables(schemas: &[Schema], given: &[Segment]) -> Vec<String> {
    let mut names: Vec<String> = config_env::not_config().map(str::to_owned).collect();
    let mut path = Vec::new();
    variables_below(schemas, given, &mut path, &mut names);
    names
}

fn variables_below(
    schemas: &[Schema],
    given: &[Segment],
    path: &mut Vec<Segment>,
    out: &mut Vec<String>,
) {
    if path.len() >= SUGGESTION_DEPTH {
        return;
    }
    let mut keys = fields_at(schemas, path);
    let map = schemas
        .iter()
        .any(|schema| schema.shape_at(path) == Shape::Map);
    if map && let Some(Segment::Key(key)) = given.get(path.len()) {
        keys.push(key.clone());
    }
    for key in keys {
        path.push(Segment::Key(key));
        // A section alone (`AGENTLOOP_RUNNER`) sets nothing, so it is no suggestion.
        if path.len() > 1 {
            let keys: Vec<&str> = path
                .iter()
                .filter_map(|segment| match segment {
                    Segment::Key(key) => Some(key.as_str()),
                    Segment::Index(_) => None,
                })
                .collect();
            out.push(config_env::variable_name(&keys));
        }
        variables_below(schemas, given, path, out);
        path.pop();
    }
}

/// Returns the candidate closest to `name` by edit distance (a swap counts once); the first
/// of equals.
fn closest(name: &str, candidates: &[String]) -> Option<String> {
    candidates
        .iter()
        .min_by_key(|candidate| strsim::damerau_levenshtein(name, candidate))
        .cloned()
}

/// Writes a path as TOML would: dotted keys, quoted where not bare, `[i]` for positions.
pub(crate) fn display(path: &[Segment]) -> String {
    let mut text = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                let bare = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    text.push_str(key);
                } else {
                    text.push_str(&format!("{key:?}"));
                }
            }
            Segment::Index(i) => text.push_str(&format!("[{i}]")),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_schema::fixtures;

    fn schemas() -> [Schema; 2] {
        [
            Schema::of::<fixtures::RunnerView>(),
            Schema::of::<fixtures::GatewayView>(),
        ]
    }

    fn check(toml: &str, variables: &[&str]) -> Vec<String> {
        let file: Table = toml.parse().unwrap();
        unknown_names(&file, variables.iter().copied(), &schemas())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_key_of_any_service_is_valid_and_a_typo_is_named_with_the_closest_key() {
        let valid = "[runner]\nmax_turns = 3\n[gateway]\nlisten = \"x\"\n";
        assert!(check(valid, &[]).is_empty());
        assert_eq!(
            check("[runner]\nmax_turn = 3\n", &[]),
            ["unknown key `runner.max_turn`; did you mean `runner.max_turns`?"]
        );
        assert_eq!(
            check("[gatway]\nlisten = \"x\"\n", &[]),
            ["unknown key `gatway`; did you mean `gateway`?"]
        );
    }

    #[test]
    fn user_chosen_keys_are_free_and_the_fields_below_them_checked() {
        assert!(check("[agents.my-agent]\nmodel = \"openai/x\"\n", &[]).is_empty());
        assert_eq!(
            check("[agents.\"a.b\"]\nmodle = \"openai/x\"\n", &[]),
            ["unknown key `agents.\"a.b\".modle`; did you mean `agents.\"a.b\".model`?"]
        );
        assert_eq!(
            check("[[runner.hooks]]\nsubjet = \"h\"\n", &[]),
            ["unknown key `runner.hooks[0].subjet`; did you mean `runner.hooks[0].subject`?"]
        );
    }

    #[test]
    fn an_unknown_variable_is_named_with_the_closest_valid_one() {
        assert!(
            check(
                "",
                &[
                    "AGENTLOOP_RUNNER__MAX_TURNS",
                    "AGENTLOOP_GATEWAY__LISTEN",
                    "AGENTLOOP_CONFIG",
                    "AGENTLOOP_AGENTS__ANY",
                    "PATH"
                ]
            )
            .is_empty()
        );
        assert_eq!(
            check(
                "",
                &[
                    "AGENTLOOP_RUNNER__MAX_TURN",
                    "AGENTLOOP_RUNER__MAX_TURNS",
                    "AGENTLOOP_CONFG"
                ]
            ),
            [
                "unknown environment variable `AGENTLOOP_RUNNER__MAX_TURN`; did you mean `AGENTLOOP_RUNNER__MAX_TURNS`?",
                "unknown environment variable `AGENTLOOP_RUNER__MAX_TURNS`; did you mean `AGENTLOOP_RUNNER__MAX_TURNS`?",
                "unknown environment variable `AGENTLOOP_CONFG`; did you mean `AGENTLOOP_CONFIG`?",
            ]
        );
    }
}

//! Agent Skills (the open format): a folder holding `SKILL.md` (YAML front matter with `name`
//! and `description`, then Markdown instructions) and optional helper files.
//!
//! Reads the global skills dir and the per-agent ones; produces the skill list for the system
//! prompt, the text the `load_skill` tool answers with, and a digest to tell snapshots apart.
//! Nothing under a skills dir is trusted: symlinks are never followed and every read is capped.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod front_matter;

pub(crate) use front_matter::parse_skill_md;

/// The file that makes a folder a skill.
const SKILL_MD: &str = "SKILL.md";
/// Largest part of a helper file kept: a skill is prompt text, not a file store.
pub(crate) const MAX_FILE_BYTES: usize = 64 * 1024;
/// Largest SKILL.md body kept, the same budget as a helper file.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest SKILL.md read: the body cap with ample room for front matter.
const MAX_SKILL_MD_BYTES: usize = 4 * MAX_BODY_BYTES;
/// Helper files kept per skill, so one skill cannot flood the tool's answers.
pub(crate) const MAX_FILES: usize = 32;
/// Folder levels read below a skill's folder (`scripts/a/b/run.sh` is three).
pub(crate) const MAX_DEPTH: usize = 3;
/// Longest description the spec allows, in characters.
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Longest name the spec allows.
const MAX_NAME_CHARS: usize = 64;
/// Names listed in a lookup error: enough to spot a typo, short enough for a tool answer.
const MAX_LISTED: usize = 20;
/// Appended where text was cut at a cap, so the model knows it saw only a part.
pub(crate) const TRUNCATED_MARKER: &str = "\n\n[truncated: longer than the 64 KiB limit]\n";

/// One skill: its SKILL.md split into name, description and body, plus its helper text files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Skill {
    /// The spec's name, equal to its folder's name.
    pub(crate) name: String,
    /// When to use the skill; what the model sees before loading it.
    pub(crate) description: String,
    /// The Markdown after the front matter, capped at [`MAX_BODY_BYTES`].
    pub(crate) body: String,
    /// UTF-8 helper files in path order, each capped at [`MAX_FILE_BYTES`].
    pub(crate) files: Vec<SkillFile>,
}

/// One helper text file of a skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SkillFile {
    /// Path relative to the skill's folder, with forward slashes.
    pub(crate) path: String,
    /// The text, ending in [`TRUNCATED_MARKER`] when it was cut.
    pub(crate) content: String,
}

/// Something skipped while loading; the rest of the load went on.
#[derive(Debug)]
pub(crate) struct SkillWarning {
    /// What was skipped (empty for a filter name that matched no skill).
    pub(crate) path: PathBuf,
    /// Why it was skipped.
    pub(crate) reason: SkillError,
}

/// Why a skill, or a part of one, could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SkillError {
    /// SKILL.md does not open with a `---` line.
    #[error("SKILL.md does not start with `---` front matter")]
    NoFrontMatter,
    /// The front matter has no closing `---` line.
    #[error("SKILL.md front matter is not closed by a `---` line")]
    UnclosedFrontMatter,
    /// The front matter has no (or an empty) `name`.
    #[error("front matter has no `name`")]
    MissingName,
    /// The front matter has no (or an empty) `description`.
    #[error("front matter has no `description`")]
    MissingDescription,
    /// A key the parser reads appears twice.
    #[error("front matter repeats `{key}`")]
    DuplicateKey { key: String },
    /// A quoted value has no closing quote.
    #[error("front matter `{key}` has an unclosed quote")]
    UnclosedQuote { key: String },
    /// The name breaks the spec's naming rule.
    #[error("invalid skill name {name:?}: {rule}")]
    InvalidName { name: String, rule: &'static str },
    /// The description is longer than the spec allows.
    #[error("description has {chars} characters, more than the {MAX_DESCRIPTION_CHARS} allowed")]
    DescriptionTooLong { chars: usize },
    /// The spec requires the folder to be named after the skill.
    #[error("folder {folder:?} does not match skill name {name:?}")]
    NameMismatch { folder: String, name: String },
    /// A subfolder of a skills dir has no SKILL.md file.
    #[error("no SKILL.md in this folder")]
    MissingSkillMd,
    /// SKILL.md is not UTF-8 text.
    #[error("SKILL.md is not UTF-8 text")]
    NotText,
    /// Links could point outside the skills dir, so none is followed.
    #[error("symlink not followed")]
    Symlink,
    /// The folder is nested deeper than [`MAX_DEPTH`] below its skill.
    #[error("folder nested deeper than {MAX_DEPTH} levels, not read")]
    TooDeep,
    /// The skill already holds [`MAX_FILES`] files; this and the rest were not read.
    #[error("more than {MAX_FILES} files in the skill, the rest not read")]
    TooManyFiles,
    /// A skills dir does not exist.
    #[error("skills folder does not exist")]
    MissingDir,
    /// Reading failed.
    #[error("failed to read")]
    Io(#[from] io::Error),
    /// The filter names a skill that no dir holds.
    #[error("skill {name:?} named in the filter was not found")]
    NotFound { name: String },
    /// The model asked for a skill that is not loaded.
    #[error("unknown skill {name:?}; available: {available}")]
    UnknownSkill { name: String, available: String },
    /// The model asked for a file the skill does not have.
    #[error("skill {skill:?} has no file {file:?}; available: {available}")]
    UnknownFile {
        skill: String,
        file: String,
        available: String,
    },
}

/// Loads every skill folder directly inside `dir`, sorted by name.
///
/// A bad skill is skipped with a warning, never failing the load; so is a skill whose folder
/// is not named after it (the spec requires the match, and it keeps names unique per dir).
pub(crate) fn load_dir(dir: &Path) -> (Vec<Skill>, Vec<SkillWarning>) {
    let mut skills = Vec::new();
    let mut warnings = Vec::new();
    let entries = match sorted_entries(dir) {
        Ok(entries) => entries,
        Err(err) => {
            let reason = if err.kind() == io::ErrorKind::NotFound {
                SkillError::MissingDir
            } else {
                SkillError::Io(err)
            };
            warnings.push(warning(dir, reason));
            return (skills, warnings);
        }
    };
    for entry in entries {
        if entry.name.starts_with('.') {
            continue;
        }
        if entry.meta.file_type().is_symlink() {
            warnings.push(warning(&entry.path, SkillError::Symlink));
        } else if entry.meta.is_dir() {
            match load_skill(&entry, &mut warnings) {
                Ok(skill) => skills.push(skill),
                Err(reason) => warnings.push(warning(&entry.path, reason)),
            }
        }
        // Plain files beside the skills (a README) are not skills and not worth a warning.
    }
    skills.sort_by(|a, b| a.name.cmp(&b.name));
    (skills, warnings)
}

/// Loads `dirs` in order and keeps the skills `filter` names (empty or `*`: all).
///
/// A skill in a later dir replaces one of the same name from an earlier dir: callers pass the
/// global `runner.skills_dir` first and the agent's own dirs after it, so the agent's wins.
pub(crate) fn load(dirs: &[PathBuf], filter: &[String]) -> (Vec<Skill>, Vec<SkillWarning>) {
    let mut by_name = BTreeMap::new();
    let mut warnings = Vec::new();
    for dir in dirs {
        let (skills, dir_warnings) = load_dir(dir);
        warnings.extend(dir_warnings);
        for skill in skills {
            by_name.insert(skill.name.clone(), skill);
        }
    }
    if !filter.is_empty() && !filter.iter().any(|name| name == "*") {
        for name in filter {
            if !by_name.contains_key(name) {
                let reason = SkillError::NotFound { name: name.clone() };
                warnings.push(warning(Path::new(""), reason));
            }
        }
        by_name.retain(|name, _| filter.contains(name));
    }
    (by_name.into_values().collect(), warnings)
}

/// Returns a stable hex digest of `skills`, so callers can tell whether a snapshot changed.
pub(crate) fn digest(skills: &[Skill]) -> String {
    // std's hashers may change between Rust releases; FNV-1a over the JSON never does.
    let mut hasher = Fnv1a(FNV_OFFSET);
    serde_json::to_writer(&mut hasher, skills)
        .expect("skills are strings and lists, and the hasher never fails to write");
    format!("{:016x}", hasher.0)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, fed through `io::Write` so the JSON is never held in memory.
struct Fnv1a(u64);

impl io::Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for byte in buf {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Returns the system prompt's skill list, or an empty string when there are no skills.
pub(crate) fn prompt_section(skills: &[Skill]) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Skills\n\nThe `load_skill` tool returns a skill's full instructions; \
         load a skill before you follow it.\n\n",
    );
    for skill in skills {
        // A literal block description has line breaks that would break the list.
        let description = skill.description.split_whitespace().collect::<Vec<_>>();
        out.push_str("- ");
        out.push_str(&skill.name);
        out.push_str(": ");
        out.push_str(&description.join(" "));
        out.push('\n');
    }
    out
}

/// Returns a skill's body, or the content of one of its files.
///
/// # Errors
/// An unknown skill or file, naming the ones that exist so the model can correct itself.
pub(crate) fn lookup<'a>(
    skills: &'a [Skill],
    name: &str,
    file: Option<&str>,
) -> Result<&'a str, SkillError> {
    let Some(skill) = skills.iter().find(|skill| skill.name == name) else {
        return Err(SkillError::UnknownSkill {
            name: name.to_owned(),
            available: listing(skills.iter().map(|skill| skill.name.as_str())),
        });
    };
    // The body is SKILL.md's text, so asking for that file by name gets it too.
    let Some(file) = file.filter(|file| *file != SKILL_MD) else {
        return Ok(&skill.body);
    };
    match skill.files.iter().find(|candidate| candidate.path == file) {
        Some(found) => Ok(&found.content),
        None => Err(SkillError::UnknownFile {
            skill: skill.name.clone(),
            file: file.to_owned(),
            available: listing(skill.files.iter().map(|file| file.path.as_str())),
        }),
    }
}

fn listing<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let total = names.len();
    if total == 0 {
        return "none".to_owned();
    }
    let mut out = names.take(MAX_LISTED).collect::<Vec<_>>().join(", ");
    if total > MAX_LISTED {
        out.push_str(&format!(" and {} more", total - MAX_LISTED));
    }
    out
}

fn warning(path: &Path, reason: SkillError) -> SkillWarning {
    SkillWarning {
        path: path.to_owned(),
        reason,
    }
}

/// A directory entry with its own metadata (that of a link, never of its target).
struct Entry {
    name: String,
    path: PathBuf,
    meta: fs::Metadata,
}

/// Lists `dir` in name order, so which files a capped load keeps does not vary.
fn sorted_entries(dir: &Path) -> io::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        // A name that is not UTF-8 can be neither a skill name nor a reported path.
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        entries.push(Entry {
            name,
            path: entry.path(),
            meta: entry.metadata()?, // does not traverse symlinks
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

fn load_skill(folder: &Entry, warnings: &mut Vec<SkillWarning>) -> Result<Skill, SkillError> {
    let md_path = folder.path.join(SKILL_MD);
    let meta = match fs::symlink_metadata(&md_path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(SkillError::MissingSkillMd);
        }
        Err(err) => return Err(err.into()),
    };
    if meta.file_type().is_symlink() {
        return Err(SkillError::Symlink);
    }
    if !meta.is_file() {
        return Err(SkillError::MissingSkillMd);
    }
    let Contents::Text { text, truncated } = read_file(&md_path, &meta, MAX_SKILL_MD_BYTES)? else {
        return Err(SkillError::NotText);
    };
    let mut skill = parse_skill_md(&text)?;
    if truncated && !skill.body.ends_with(TRUNCATED_MARKER) {
        skill.body.push_str(TRUNCATED_MARKER);
    }
    if folder.name != skill.name {
        return Err(SkillError::NameMismatch {
            folder: folder.name.clone(),
            name: skill.name,
        });
    }
    let mut walk = Walk {
        files: Vec::new(),
        warnings,
        full: false,
    };
    walk.folder(&folder.path, "", 0);
    skill.files = walk.files;
    Ok(skill)
}

/// The helper files gathered so far while walking one skill's folder.
struct Walk<'w> {
    files: Vec<SkillFile>,
    warnings: &'w mut Vec<SkillWarning>,
    full: bool,
}

impl Walk<'_> {
    fn folder(&mut self, dir: &Path, rel: &str, depth: usize) {
        let entries = match sorted_entries(dir) {
            Ok(entries) => entries,
            Err(err) => {
                self.warnings.push(warning(dir, err.into()));
                return;
            }
        };
        for entry in entries {
            if self.full {
                return;
            }
            // Hidden entries (`.git`, editor swap files) would eat the file budget.
            if entry.name.starts_with('.') || (depth == 0 && entry.name == SKILL_MD) {
                continue;
            }
            let rel_path = if rel.is_empty() {
                entry.name.clone()
            } else {
                format!("{rel}/{}", entry.name)
            };
            let file_type = entry.meta.file_type();
            if file_type.is_symlink() {
                self.warnings
                    .push(warning(&entry.path, SkillError::Symlink));
            } else if file_type.is_dir() {
                if depth < MAX_DEPTH {
                    self.folder(&entry.path, &rel_path, depth + 1);
                } else {
                    self.warnings
                        .push(warning(&entry.path, SkillError::TooDeep));
                }
            } else if file_type.is_file() {
                self.file(&entry, rel_path);
            }
            // Sockets and FIFOs are skipped: opening a FIFO would block the load.
        }
    }

    fn file(&mut self, entry: &Entry, rel_path: String) {
        match read_file(&entry.path, &entry.meta, MAX_FILE_BYTES) {
            Ok(Contents::Text { .. }) if self.files.len() == MAX_FILES => {
                self.warnings
                    .push(warning(&entry.path, SkillError::TooManyFiles));
                self.full = true;
            }
            Ok(Contents::Text {
                mut text,
                truncated,
            }) => {
                if truncated {
                    text.push_str(TRUNCATED_MARKER);
                }
                self.files.push(SkillFile {
                    path: rel_path,
                    content: text,
                });
            }
            Ok(Contents::Binary) => {} // images and archives are not prompt text
            Err(reason) => self.warnings.push(warning(&entry.path, reason)),
        }
    }
}

/// What a capped read found.
enum Contents {
    Text { text: String, truncated: bool },
    Binary,
}

/// Reads at most `cap` bytes of the regular file `listed` describes.
fn read_file(path: &Path, listed: &fs::Metadata, cap: usize) -> Result<Contents, SkillError> {
    let file = fs::File::open(path)?;
    // The entry was a regular file when listed; if it was swapped for a symlink since, the
    // open followed it to another file, which is refused rather than read.
    if !same_file(listed, &file.metadata()?) {
        return Err(SkillError::Symlink);
    }
    let mut bytes = Vec::new();
    file.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    let truncated = bytes.len() > cap;
    bytes.truncate(cap);
    if bytes.contains(&0) {
        return Ok(Contents::Binary);
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Contents::Text { text, truncated }),
        // The cap can split a character; only invalid bytes before the cut mean binary.
        Err(err) if truncated && err.utf8_error().error_len().is_none() => {
            let valid = err.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&err.as_bytes()[..valid]).into_owned();
            Ok(Contents::Text { text, truncated })
        }
        Err(_) => Ok(Contents::Binary),
    }
}

#[cfg(unix)]
fn same_file(listed: &fs::Metadata, opened: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    listed.dev() == opened.dev() && listed.ino() == opened.ino()
}

#[cfg(not(unix))]
fn same_file(_listed: &fs::Metadata, opened: &fs::Metadata) -> bool {
    opened.is_file()
}

#[cfg(test)]
mod tests;

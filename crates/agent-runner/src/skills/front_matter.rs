//! SKILL.md: its front matter read by a small parser of the YAML subset skills use (top-level
//! scalars, quoted or block; nested maps skipped), its name checked against the spec's rule.

use super::*;

/// Parses SKILL.md text into a skill with no files (the loader adds them).
///
/// # Errors
/// No or unclosed front matter, a missing or invalid name, a missing or too long description.
pub(crate) fn parse_skill_md(text: &str) -> Result<Skill, SkillError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Skills are often written on Windows; one line ending keeps parser and body simple.
    let text = text.replace("\r\n", "\n");
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    if first.trim_end() != "---" {
        return Err(SkillError::NoFrontMatter);
    }
    let mut front = Vec::new();
    let mut body = None;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        if line.trim_end() == "---" {
            body = Some(&rest[offset..]);
            break;
        }
        front.push(line.trim_end_matches('\n'));
    }
    let body = body.ok_or(SkillError::UnclosedFrontMatter)?;
    let (name, description) = front_matter(&front)?;
    let name = name.ok_or(SkillError::MissingName)?;
    validate_name(&name)?;
    let description = description.ok_or(SkillError::MissingDescription)?;
    let chars = description.chars().count();
    if chars > MAX_DESCRIPTION_CHARS {
        return Err(SkillError::DescriptionTooLong { chars });
    }
    Ok(Skill {
        name,
        description,
        body: cap_text(body.trim_start_matches('\n'), MAX_BODY_BYTES),
        files: Vec::new(),
    })
}

/// Reads `name` and `description`; other keys, and the indented lines of nested maps, are
/// skipped because skills carry `license`, `allowed-tools` and `metadata:` we have no use for.
fn front_matter(lines: &[&str]) -> Result<(Option<String>, Option<String>), SkillError> {
    let mut name = None;
    let mut description = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if is_indented(line) || line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, raw)) = line.split_once(':') else {
            continue;
        };
        let key = key.trim();
        let slot = match key {
            "name" => &mut name,
            "description" => &mut description,
            _ => continue,
        };
        if slot.is_some() {
            return Err(SkillError::DuplicateKey {
                key: key.to_owned(),
            });
        }
        let start = i;
        while i < lines.len() && (is_indented(lines[i]) || lines[i].trim().is_empty()) {
            i += 1;
        }
        let value = scalar(key, raw.trim(), &lines[start..i])?;
        *slot = Some(value).filter(|value| !value.is_empty());
    }
    Ok((name, description))
}

fn is_indented(line: &str) -> bool {
    line.starts_with([' ', '\t'])
}

/// Reads one value: a block scalar (`|`, `>`), a quoted string or a plain one, each of which
/// YAML lets continue on the indented lines that follow.
fn scalar(key: &str, raw: &str, continuation: &[&str]) -> Result<String, SkillError> {
    if raw.starts_with(['|', '>']) {
        return Ok(block_scalar(raw.starts_with('|'), continuation));
    }
    // Flow scalars fold their line breaks into spaces.
    let mut joined = raw.to_owned();
    for line in continuation.iter().map(|line| line.trim()) {
        if !line.is_empty() {
            joined.push(' ');
            joined.push_str(line);
        }
    }
    let unclosed = || SkillError::UnclosedQuote {
        key: key.to_owned(),
    };
    if let Some(quoted) = joined.strip_prefix('"') {
        return double_quoted(quoted).ok_or_else(unclosed);
    }
    if let Some(quoted) = joined.strip_prefix('\'') {
        return single_quoted(quoted).ok_or_else(unclosed);
    }
    let plain = match joined.find(" #") {
        Some(comment) => &joined[..comment],
        None if joined.starts_with('#') => "",
        None => &joined,
    };
    Ok(plain.trim().to_owned())
}

/// Keeps line breaks (`|`) or folds lines into spaces (`>`); more-indented lines and explicit
/// chomping are not distinguished, as a description is trimmed anyway.
fn block_scalar(literal: bool, lines: &[&str]) -> String {
    let indent = lines
        .iter()
        .find(|line| !line.trim().is_empty())
        .map_or(0, |line| line.len() - line.trim_start().len());
    let mut out = String::new();
    for line in lines {
        let text = if line.trim().is_empty() {
            ""
        } else {
            let leading = line.len() - line.trim_start().len();
            &line[leading.min(indent)..]
        };
        if literal {
            out.push_str(text);
            out.push('\n');
        } else if text.is_empty() {
            out.push('\n');
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(text);
        }
    }
    out.trim().to_owned()
}

fn double_quoted(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out.trim().to_owned()),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other @ ('"' | '\\' | '/') => out.push(other),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            },
            c => out.push(c),
        }
    }
    None
}

fn single_quoted(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            out.push(c);
        } else if chars.peek() == Some(&'\'') {
            chars.next();
            out.push('\'');
        } else {
            return Some(out.trim().to_owned());
        }
    }
    None
}

/// Applies the spec's rule: 1–64 of `a-z`, `0-9`, `-`, no hyphen at either end, no `--`.
fn validate_name(name: &str) -> Result<(), SkillError> {
    let rule = if name.chars().count() > MAX_NAME_CHARS {
        "must be at most 64 characters"
    } else if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        "only lowercase letters, digits and hyphens are allowed"
    } else if name.starts_with('-') || name.ends_with('-') {
        "must not start or end with a hyphen"
    } else if name.contains("--") {
        "must not contain consecutive hyphens"
    } else {
        return Ok(());
    };
    Err(SkillError::InvalidName {
        name: name.to_owned(),
        rule,
    })
}

fn cap_text(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_owned();
    }
    format!(
        "{}{TRUNCATED_MARKER}",
        &text[..text.floor_char_boundary(cap)]
    )
}

use super::*;

/// A unique folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("agentloop-skills-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn write(&self, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        path
    }

    fn skill(&self, folder: &str, name: &str, description: &str, body: &str) {
        let text = format!("---\nname: {name}\ndescription: {description}\n---\n{body}");
        self.write(&format!("{folder}/SKILL.md"), text);
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn names(skills: &[Skill]) -> Vec<&str> {
    skills.iter().map(|skill| skill.name.as_str()).collect()
}

fn skill(name: &str, description: &str, body: &str) -> Skill {
    Skill {
        name: name.into(),
        description: description.into(),
        body: body.into(),
        files: vec![SkillFile {
            path: "scripts/run.sh".into(),
            content: "echo hi\n".into(),
        }],
    }
}

#[test]
fn quoted_values_are_unquoted() {
    let text =
        "---\nname: \"pdf-tools\"\ndescription: 'It''s for \"PDF\" files # really'\n---\nBody\n";

    let skill = parse_skill_md(text).unwrap();

    assert_eq!(skill.name, "pdf-tools");
    assert_eq!(skill.description, "It's for \"PDF\" files # really");
    assert_eq!(skill.body, "Body\n");
    let escaped =
        parse_skill_md("---\nname: a\ndescription: \"tab\\there \\\"q\\\"\"\n---\n").unwrap();
    assert_eq!(escaped.description, "tab\there \"q\"");
}

#[test]
fn folded_and_literal_block_scalars_are_read_for_the_description() {
    let folded = "---\nname: a\ndescription: >\n  Extracts text\n  from PDFs.\n\n  Use for forms.\nlicense: MIT\n---\nbody";
    let literal = "---\nname: a\ndescription: |-\n    line one\n    line two\n---\nbody";

    let folded = parse_skill_md(folded).unwrap();
    let literal = parse_skill_md(literal).unwrap();

    assert_eq!(
        folded.description,
        "Extracts text from PDFs.\nUse for forms."
    );
    assert_eq!(literal.description, "line one\nline two");
}

#[test]
fn a_plain_value_may_continue_on_indented_lines_and_loses_its_comment() {
    let text = "---\nname: a # the name\ndescription: Long text\n  on two lines\n---\n";

    let skill = parse_skill_md(text).unwrap();

    assert_eq!(skill.name, "a");
    assert_eq!(skill.description, "Long text on two lines");
}

#[test]
fn nested_metadata_and_unknown_keys_are_ignored() {
    let text = "---\n# comment\nlicense: Apache-2.0\nallowed-tools: Bash(git:*) Read\nmetadata:\n  name: not-this\n  description: nor this\n  nested:\n    deep: x\nname: real\ndescription: The real one\n---\n# Title\n";

    let skill = parse_skill_md(text).unwrap();

    assert_eq!(skill.name, "real");
    assert_eq!(skill.description, "The real one");
    assert_eq!(skill.body, "# Title\n");
}

#[test]
fn crlf_line_endings_parse_like_lf() {
    let text = "\u{feff}---\r\nname: crlf\r\ndescription: >\r\n  Windows\r\n  text\r\n---\r\nline 1\r\nline 2\r\n";

    let skill = parse_skill_md(text).unwrap();

    assert_eq!(skill.name, "crlf");
    assert_eq!(skill.description, "Windows text");
    assert_eq!(skill.body, "line 1\nline 2\n");
}

#[test]
fn missing_front_matter_or_fields_are_errors() {
    let cases = [
        ("# just markdown\n", "NoFrontMatter"),
        ("---\nname: a\ndescription: b\n", "UnclosedFrontMatter"),
        ("---\ndescription: b\n---\n", "MissingName"),
        ("---\nname: \"\"\ndescription: b\n---\n", "MissingName"),
        ("---\nname: a\n---\n", "MissingDescription"),
        ("---\nname: a\ndescription:\n---\n", "MissingDescription"),
        (
            "---\nname: a\nname: b\ndescription: c\n---\n",
            "DuplicateKey",
        ),
        ("---\nname: a\ndescription: \"open\n---\n", "UnclosedQuote"),
    ];

    for (text, expected) in cases {
        let err = parse_skill_md(text).unwrap_err();
        assert!(
            format!("{err:?}").starts_with(expected),
            "{text:?} gave {err:?}"
        );
    }
}

#[test]
fn names_breaking_the_spec_rule_are_rejected() {
    let long = "a".repeat(65);
    let bad = [
        "PDF",
        "pdf_tools",
        "-pdf",
        "pdf-",
        "pdf--tools",
        "pdf tools",
        "pdé",
        &long,
    ];
    let good = ["a", "pdf-tools", "v2-api", &"a".repeat(64)];

    for name in bad {
        let text = format!("---\nname: {name}\ndescription: d\n---\n");
        let err = parse_skill_md(&text).unwrap_err();
        assert!(
            matches!(err, SkillError::InvalidName { .. }),
            "{name:?} gave {err:?}"
        );
    }
    for name in good {
        let text = format!("---\nname: {name}\ndescription: d\n---\n");
        assert_eq!(parse_skill_md(&text).unwrap().name, name);
    }
}

#[test]
fn a_description_over_1024_characters_is_rejected() {
    let at_limit = format!("---\nname: a\ndescription: {}\n---\n", "é".repeat(1024));
    let over = format!("---\nname: a\ndescription: {}\n---\n", "é".repeat(1025));

    assert!(parse_skill_md(&at_limit).is_ok());
    assert!(matches!(
        parse_skill_md(&over),
        Err(SkillError::DescriptionTooLong { chars: 1025 })
    ));
}

#[test]
fn an_oversized_body_is_truncated_with_a_marker() {
    let text = format!(
        "---\nname: a\ndescription: d\n---\n{}",
        "ü".repeat(MAX_BODY_BYTES)
    );

    let skill = parse_skill_md(&text).unwrap();

    assert!(skill.body.ends_with(TRUNCATED_MARKER));
    assert!(skill.body.len() <= MAX_BODY_BYTES + TRUNCATED_MARKER.len());
}

#[test]
fn load_dir_reads_a_good_skill_with_its_text_files() {
    let dir = TempDir::new();
    dir.skill("pdf", "pdf", "Reads PDFs", "Run scripts/extract.py\n");
    dir.write("pdf/scripts/extract.py", "print('hi')\n");
    dir.write("pdf/reference/a/b/deep.md", "three levels\n");
    dir.write("pdf/reference/a/b/c/deeper.md", "four levels\n");
    dir.write("pdf/logo.png", [0x89, b'P', b'N', b'G', 0, 1, 2]);
    dir.write("pdf/.git/config", "hidden");
    dir.write("README.md", "not a skill");

    let (skills, warnings) = load_dir(&dir.0);

    assert_eq!(names(&skills), ["pdf"]);
    let skill = &skills[0];
    assert_eq!(skill.description, "Reads PDFs");
    assert_eq!(skill.body, "Run scripts/extract.py\n");
    let paths: Vec<&str> = skill.files.iter().map(|file| file.path.as_str()).collect();
    assert_eq!(paths, ["reference/a/b/deep.md", "scripts/extract.py"]);
    assert_eq!(skill.files[1].content, "print('hi')\n");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(matches!(warnings[0].reason, SkillError::TooDeep));
}

#[test]
fn load_dir_skips_a_bad_skill_with_a_warning() {
    let dir = TempDir::new();
    dir.skill("good", "good", "Fine", "ok");
    dir.write("bad/SKILL.md", "---\nname: bad\n---\nno description");
    dir.write("empty/notes.md", "no SKILL.md here");

    let (skills, warnings) = load_dir(&dir.0);

    assert_eq!(names(&skills), ["good"]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert_eq!(warnings[0].path, dir.0.join("bad"));
    assert!(matches!(warnings[0].reason, SkillError::MissingDescription));
    assert_eq!(warnings[1].path, dir.0.join("empty"));
    assert!(matches!(warnings[1].reason, SkillError::MissingSkillMd));
}

#[test]
fn load_dir_skips_a_skill_whose_folder_is_not_named_after_it() {
    let dir = TempDir::new();
    dir.skill("folder", "other-name", "Mismatched", "body");

    let (skills, warnings) = load_dir(&dir.0);

    assert!(skills.is_empty());
    assert_eq!(warnings.len(), 1);
    assert!(matches!(
        &warnings[0].reason,
        SkillError::NameMismatch { folder, name } if folder == "folder" && name == "other-name"
    ));
}

#[test]
fn load_dir_of_a_missing_folder_is_empty_with_a_warning() {
    let dir = TempDir::new();
    let missing = dir.0.join("nope");

    let (skills, warnings) = load_dir(&missing);

    assert!(skills.is_empty());
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].path, missing);
    assert!(matches!(warnings[0].reason, SkillError::MissingDir));
}

#[cfg(unix)]
#[test]
fn symlinks_to_etc_passwd_are_never_read() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new();
    let outside = TempDir::new();
    outside.skill("linked", "linked", "Outside", "outside body");
    dir.skill("evil", "evil", "Has links", "body");
    symlink("/etc/passwd", dir.0.join("evil/passwd.txt")).unwrap();
    symlink("/etc", dir.0.join("evil/etc")).unwrap();
    fs::create_dir_all(dir.0.join("sneaky")).unwrap();
    symlink("/etc/passwd", dir.0.join("sneaky/SKILL.md")).unwrap();
    symlink(outside.0.join("linked"), dir.0.join("linked")).unwrap();

    let (skills, warnings) = load_dir(&dir.0);

    assert_eq!(names(&skills), ["evil"]);
    assert!(skills[0].files.is_empty(), "{:?}", skills[0].files);
    let json = serde_json::to_string(&skills).unwrap();
    assert!(!json.contains("root:"));
    let mut linked: Vec<_> = warnings
        .iter()
        .filter(|warning| matches!(warning.reason, SkillError::Symlink))
        .map(|warning| warning.path.clone())
        .collect();
    linked.sort();
    let mut expected = vec![
        dir.0.join("evil/etc"),
        dir.0.join("evil/passwd.txt"),
        dir.0.join("linked"),
        dir.0.join("sneaky"),
    ];
    expected.sort();
    assert_eq!(linked, expected);
}

#[test]
fn an_oversized_file_is_capped_with_a_marker() {
    let dir = TempDir::new();
    dir.skill("big", "big", "Big file", "body");
    dir.write("big/data.txt", "é".repeat(MAX_FILE_BYTES));

    let (skills, _) = load_dir(&dir.0);

    let content = &skills[0].files[0].content;
    assert!(content.ends_with(TRUNCATED_MARKER));
    assert!(content.len() <= MAX_FILE_BYTES + TRUNCATED_MARKER.len());
    assert!(content.starts_with("éé"));
}

#[test]
fn files_beyond_32_are_not_read() {
    let dir = TempDir::new();
    dir.skill("many", "many", "Many files", "body");
    for i in 0..40 {
        dir.write(&format!("many/f{i:02}.txt"), "x");
    }

    let (skills, warnings) = load_dir(&dir.0);

    assert_eq!(skills[0].files.len(), MAX_FILES);
    assert_eq!(skills[0].files[31].path, "f31.txt");
    assert_eq!(warnings.len(), 1);
    assert!(matches!(warnings[0].reason, SkillError::TooManyFiles));
}

#[test]
fn a_later_dir_overrides_an_earlier_one_with_the_same_name() {
    let global = TempDir::new();
    let agent = TempDir::new();
    global.skill("shared", "shared", "Global version", "global");
    global.skill("only-global", "only-global", "G", "g");
    agent.skill("shared", "shared", "Agent version", "agent");

    let (skills, warnings) = load(&[global.0.clone(), agent.0.clone()], &[]);

    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(names(&skills), ["only-global", "shared"]);
    assert_eq!(skills[1].body, "agent");
}

#[test]
fn a_filter_keeps_only_the_named_skills_and_star_keeps_all() {
    let dir = TempDir::new();
    for name in ["a", "b", "c"] {
        dir.skill(name, name, "d", "body");
    }
    let dirs = [dir.0.clone()];

    let (some, some_warnings) = load(&dirs, &["c".into(), "a".into(), "zz".into()]);
    let (all, _) = load(&dirs, &["*".into()]);
    let (unfiltered, _) = load(&dirs, &[]);

    assert_eq!(names(&some), ["a", "c"]);
    assert_eq!(some_warnings.len(), 1);
    assert!(matches!(&some_warnings[0].reason, SkillError::NotFound { name } if name == "zz"));
    assert_eq!(names(&all), ["a", "b", "c"]);
    assert_eq!(names(&unfiltered), ["a", "b", "c"]);
}

#[test]
fn prompt_section_lists_each_skill_on_one_line() {
    let skills = [
        skill("pdf", "Reads\nPDFs", "b"),
        skill("xlsx", "Edits sheets", "b"),
    ];

    let section = prompt_section(&skills);

    assert!(section.starts_with("## Skills\n"));
    assert!(section.contains("`load_skill`"));
    assert!(section.ends_with("- pdf: Reads PDFs\n- xlsx: Edits sheets\n"));
    assert_eq!(prompt_section(&[]), "");
}

#[test]
fn lookup_returns_the_body_or_a_file_and_names_what_exists_on_error() {
    let skills = [skill("pdf", "d", "the body")];

    assert_eq!(lookup(&skills, "pdf", None).unwrap(), "the body");
    assert_eq!(
        lookup(&skills, "pdf", Some("SKILL.md")).unwrap(),
        "the body"
    );
    assert_eq!(
        lookup(&skills, "pdf", Some("scripts/run.sh")).unwrap(),
        "echo hi\n"
    );
    let unknown_skill = lookup(&skills, "pfd", None).unwrap_err().to_string();
    assert_eq!(unknown_skill, "unknown skill \"pfd\"; available: pdf");
    let unknown_file = lookup(&skills, "pdf", Some("run.sh"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        unknown_file,
        "skill \"pdf\" has no file \"run.sh\"; available: scripts/run.sh"
    );
    assert!(
        lookup(&[], "pdf", None)
            .unwrap_err()
            .to_string()
            .ends_with("available: none")
    );
}

#[test]
fn an_unknown_skill_error_caps_the_names_it_lists() {
    let skills: Vec<Skill> = (0..25)
        .map(|i| skill(&format!("s{i:02}"), "d", "b"))
        .collect();

    let message = lookup(&skills, "nope", None).unwrap_err().to_string();

    assert!(message.contains("s19"));
    assert!(!message.contains("s20"));
    assert!(message.ends_with(" and 5 more"));
}

#[test]
fn digest_is_stable_and_changes_with_the_content() {
    let skills = [skill("pdf", "d", "body")];
    let changed = [skill("pdf", "d", "body!")];

    assert_eq!(digest(&skills), digest(&skills.clone()));
    assert_ne!(digest(&skills), digest(&changed));
    assert_eq!(digest(&skills).len(), 16);
    // Published FNV-1a 64 vectors pin the hash across releases: "" and "a".
    assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(digest(&[]), format!("{:016x}", fnv(b"[]")));
}

fn fnv(bytes: &[u8]) -> u64 {
    use std::io::Write as _;
    let mut hasher = Fnv1a(FNV_OFFSET);
    hasher.write_all(bytes).unwrap();
    hasher.0
}

//! A marked section of `bench/RESULTS.md`: written between its markers, so a run of one kind
//! replaces its own section and keeps the others.

/// The begin and end markers of one section.
pub struct Markers {
    /// The line that opens the section.
    pub begin: &'static str,
    /// The line that closes it.
    pub end: &'static str,
}

impl Markers {
    /// `existing` with this section replaced by `section`, or `section` appended.
    pub fn splice(&self, existing: &str, section: &str) -> String {
        match (existing.find(self.begin), existing.find(self.end)) {
            (Some(b), Some(e)) if e > b => format!(
                "{}{}{}",
                &existing[..b],
                section.trim_end(),
                existing[e + self.end.len()..]
                    .trim_end_matches('\n')
                    .to_owned()
                    + "\n"
            ),
            _ => format!("{}\n{section}", existing.trim_end().to_owned() + "\n"),
        }
    }

    /// This section of `existing`, if it has one.
    pub fn extract(&self, existing: &str) -> Option<String> {
        let b = existing.find(self.begin)?;
        let e = existing.find(self.end)?;
        (e > b).then(|| existing[b..e + self.end.len()].to_owned() + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Markers = Markers {
        begin: "<!-- t:begin -->",
        end: "<!-- t:end -->",
    };

    #[test]
    fn the_section_is_replaced_in_place_or_appended() {
        let (begin, end) = (M.begin, M.end);
        let section = format!("{begin}\nnew\n{end}\n");
        let appended = M.splice("# r\n\nbody\n", &section);
        assert_eq!(appended, format!("# r\n\nbody\n\n{section}"));
        let old = format!("# r\n\n{begin}\nold\n{end}\n\ntail\n");
        let replaced = M.splice(&old, &section);
        assert_eq!(replaced, format!("# r\n\n{begin}\nnew\n{end}\n\ntail\n"));
        assert_eq!(M.extract(&replaced).as_deref(), Some(section.as_str()));
    }
}

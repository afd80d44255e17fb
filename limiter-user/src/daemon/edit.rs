//! Rule edits and saving, apart from the kernel: an edit applied to the
//! file form and validated as a whole file would be (pure, so property
//! tests drive it without a kernel), and the configuration written back
//! atomically and durably.

use std::path::Path;

use crate::{
    config::{Config, FileConfig, RuleSection},
    proto::RuleEdit,
};

/// The pure part of a rule edit: `edit` applied to a copy of `file`, the
/// result validated as a whole file would be. Returns the edited file, its
/// validated configuration (before command-line overrides) and what
/// changed, or the answer to give; `file` itself is never touched, so a
/// rejected edit changes nothing. Public so the property tests can drive
/// it without a kernel.
pub fn apply_rule_edit(
    file: &FileConfig,
    edit: RuleEdit,
) -> Result<(FileConfig, Config, String), String> {
    let mut file = file.clone();
    let describe = |r: &RuleSection| {
        r.cidr.map_or_else(
            || "the default rule".to_string(),
            |c| format!("the rule for {c}"),
        )
    };
    // Where the rule that `rule` names is, or the answer (with `hint`).
    let existing = |file: &FileConfig, rule: &RuleSection, hint: &str| {
        file.rules
            .iter()
            .position(|r| r.same_rule(rule))
            .ok_or_else(|| format!("{} with that match does not exist{hint}", describe(rule)))
    };
    if let RuleEdit::Set { rule } | RuleEdit::Remove { rule } = &edit {
        // Only the default rule has no cidr, and these cannot name it: say
        // what is missing rather than that no such rule exists.
        if rule.cidr.is_none() {
            return Err(
                "a rule needs a cidr (the default rule is replaced with `default set`)".into(),
            );
        }
    }
    let what = match edit {
        RuleEdit::Add { rule } => {
            if rule.cidr.is_none() {
                return Err("a rule needs a cidr".into());
            }
            if file.rules.iter().any(|r| r.same_rule(&rule)) {
                return Err(format!(
                    "{} with that match exists; use `rule set`",
                    describe(&rule)
                ));
            }
            let what = format!("added {}", describe(&rule));
            file.rules.push(rule);
            what
        }
        RuleEdit::Set { rule } => {
            let index = existing(&file, &rule, "; use `rule add`")?;
            let what = format!("replaced {}", describe(&rule));
            file.rules[index] = rule;
            what
        }
        RuleEdit::Remove { rule } => {
            let index = existing(&file, &rule, "")?;
            file.rules.remove(index);
            format!("removed {}", describe(&rule))
        }
        RuleEdit::Default { rule } => {
            if rule.cidr.is_some() {
                return Err("the default rule covers every source; it takes no cidr".into());
            }
            file.default = rule;
            "replaced the default rule".to_string()
        }
    };
    let fresh = file
        .clone()
        .validate()
        .map_err(|e| format!("rejected: {e}"))?;
    Ok((file, fresh, what))
}

/// Writes the configuration in force to the file the daemon was started
/// with: to a new file, synced, then renamed over it (and the directory
/// synced), so a crash leaves the old file or the new one, never half of
/// one. A file that changed on disk since the daemon last read or wrote it
/// is not overwritten: that would silently drop an edit not yet reloaded.
pub fn save(path: Option<&Path>, config: &mut Config, done: &str) -> Result<String, String> {
    let Some(path) = path else {
        return Err(format!(
            "{done} (live), but not saved: the daemon was started without --config"
        ));
    };
    let on_disk = std::fs::read_to_string(path).ok();
    if on_disk != config.text {
        return Err(format!(
            "{done} (live), but not saved: {} changed on disk since the daemon last read it; \
             `xdp-limiter reload` loads the file (dropping live edits not in it), or edit the file",
            path.display()
        ));
    }
    let text = config.file.to_toml();
    write_durably(path, &text)
        .map_err(|e| format!("{done} (live), but saving {} failed: {e}", path.display()))?;
    config.text = Some(text);
    Ok(format!("{done}; saved to {}", path.display()))
}

/// Replaces `path` with `text` atomically and durably.
fn write_durably(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("toml.new");
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

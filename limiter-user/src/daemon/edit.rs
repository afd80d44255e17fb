//! Rule edits and saving, apart from the kernel: an edit applied to the
//! file form and validated as a whole file would be (pure, so property
//! tests drive it without a kernel), and the configuration written back
//! atomically and durably.

use std::path::Path;

use crate::{
    config::{text, Config, FileConfig, RuleSection},
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
    let removing = matches!(edit, RuleEdit::Remove { .. });
    let describe = |r: &RuleSection| match r.cidr {
        None if removing => format!("the rule named {}", r.effective_name()),
        None => "the default rule".to_string(),
        Some(c) => format!("the rule for {c}"),
    };
    // Where the rule that `rule` names (by its name when it has no
    // prefix, else by its prefix and match) is, or the answer (with
    // `hint`).
    let existing = |file: &FileConfig, rule: &RuleSection, hint: &str| {
        let found = match (&rule.name, rule.cidr) {
            (Some(name), None) => file.rules.iter().position(|r| r.effective_name() == *name),
            _ => file.rules.iter().position(|r| r.same_rule(rule)),
        };
        found.ok_or_else(|| match (&rule.name, rule.cidr) {
            (Some(name), None) => {
                let names: Vec<String> =
                    file.rules.iter().map(RuleSection::effective_name).collect();
                format!("no rule is named {name} (the rules: {})", names.join(", "))
            }
            _ => format!("{} with that match does not exist{hint}", describe(rule)),
        })
    };
    match &edit {
        RuleEdit::Set { rule } if rule.cidr.is_none() => {
            // Only the default rule has no cidr, and this cannot name it:
            // say what is missing rather than that no such rule exists.
            return Err(
                "a rule needs a cidr (the default rule is replaced with `default set`)".into(),
            );
        }
        RuleEdit::Remove { rule } if rule.cidr.is_none() && rule.name.is_none() => {
            return Err("a rule to remove needs a cidr or a name".into());
        }
        _ => {}
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
            let what = format!("added {} as {}", describe(&rule), rule.effective_name());
            file.rules.push(rule);
            what
        }
        RuleEdit::Set { mut rule } => {
            let index = existing(&file, &rule, "; use `rule add`")?;
            // A rule keeps its name unless the edit gives another.
            if rule.name.is_none() {
                rule.name = file.rules[index].name.clone();
            }
            let what = format!("replaced {}", describe(&rule));
            file.rules[index] = rule;
            what
        }
        RuleEdit::Remove { rule } => {
            let index = existing(&file, &rule, "")?;
            let gone = file.rules.remove(index);
            format!("removed {} ({})", describe(&gone), gone.effective_name())
        }
        RuleEdit::Default { mut rule } => {
            if rule.cidr.is_some() {
                return Err("the default rule covers every source; it takes no cidr".into());
            }
            if rule.name.is_none() {
                rule.name = file.default.name.clone();
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
/// with, edited in place (`config::text::edit_in_place`: the operator's
/// comments, order and formatting stay), to a new file with the old one's
/// mode and owner, synced, then renamed over it (and the directory
/// synced), so a crash leaves the old file or the new one, never half of
/// one. A file that changed on disk since the daemon last read or wrote it
/// is not overwritten: that would silently drop an edit not yet reloaded.
/// Nor is a file that holds a password and that the group or others may
/// read: a save must not spread a secret the file already leaks.
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
    let not_saved = |why: String| format!("{done} (live), but not saved: {why}");
    // A derived name is written once and kept from then on, whatever
    // else changes.
    for rule in &mut config.file.rules {
        if rule.name.is_none() {
            rule.name = Some(rule.derived_name());
        }
    }
    let text = match &on_disk {
        Some(original) => {
            let before: FileConfig = toml::from_str(original)
                .map_err(|_| not_saved(format!("{} no longer parses", path.display())))?;
            text::edit_in_place(original, &before, &config.file)
                .map_err(|e| not_saved(format!("editing {} failed: {e}", path.display())))?
        }
        None => config.file.to_toml(),
    };
    let secret = text::holds_secret(&config.file);
    write_durably(path, &text, secret).map_err(|e| match e {
        WriteError::Readable { mode } => not_saved(format!(
            "{} holds a Redis password and its mode {mode:04o} lets the group or others read \
             it; `chmod 600 {}` first, or keep the password in cluster.password_file",
            path.display(),
            path.display()
        )),
        WriteError::Io(e) => format!("{done} (live), but saving {} failed: {e}", path.display()),
    })?;
    config.text = Some(text);
    Ok(format!("{done}; saved to {}", path.display()))
}

/// Why a save did not write.
#[derive(Debug)]
enum WriteError {
    /// The file holds a secret and `mode` gives the group or others access.
    Readable {
        mode: u32,
    },
    Io(std::io::Error),
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Replaces `path` with `text` atomically and durably, keeping its mode
/// and owner (a new file gets 0600 and the daemon's owner). `secret`: the
/// text holds a password, so a mode with group or other access refuses.
fn write_durably(path: &Path, text: &str, secret: bool) -> Result<(), WriteError> {
    use std::{
        fs::{OpenOptions, Permissions},
        io::Write,
        os::unix::fs::{fchown, MetadataExt, OpenOptionsExt, PermissionsExt},
    };
    let (mode, owner) = match std::fs::metadata(path) {
        Ok(meta) => (meta.mode() & 0o7777, Some((meta.uid(), meta.gid()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0o600, None),
        Err(e) => return Err(e.into()),
    };
    if secret && mode & 0o077 != 0 {
        return Err(WriteError::Readable { mode });
    }
    let tmp = path.with_extension("toml.new");
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        // Created owner-only whatever the umask, then given the old mode.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            fchown(&file, Some(uid), Some(gid))?;
        }
        file.set_permissions(Permissions::from_mode(mode))?;
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
    written.map_err(WriteError::Io)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};

    use super::*;

    /// A configuration file in a temporary directory, with `mode`, as the
    /// daemon read it.
    fn file_with(text: &str, mode: u32) -> (tempfile::TempDir, std::path::PathBuf, Config) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let config = Config::load(&path).unwrap();
        (dir, path, config)
    }

    /// `rule add 203.0.113.0/24 --pps 5` applied to `config`, as the
    /// daemon applies it before saving.
    fn add_rule(config: &mut Config) {
        let rule: RuleSection = toml::from_str("cidr = \"203.0.113.0/24\"\npps = 5\n").unwrap();
        let (file, _, _) = apply_rule_edit(&config.file, RuleEdit::Add { rule }).unwrap();
        config.file = file;
    }

    #[test]
    fn saving_the_shipped_configuration_keeps_every_comment_its_mode_and_owner() {
        let shipped =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/config.toml"))
                .unwrap();
        let (_dir, path, mut config) = file_with(&shipped, 0o600);
        chown(&path, Some(65534), Some(65534)).unwrap();
        add_rule(&mut config);
        save(Some(&path), &mut config, "added").unwrap();
        let saved = std::fs::read_to_string(&path).unwrap();
        // Every line of the shipped file is still there, in order, and the
        // rule was added after the last rule, before the commented-out
        // examples that end the file.
        let mut rest = saved.as_str();
        for line in shipped.lines() {
            let at = rest
                .find(line)
                .unwrap_or_else(|| panic!("lost or moved {line:?}:\n{saved}"));
            rest = &rest[at + line.len()..];
        }
        let added = saved
            .find("cidr = \"203.0.113.0/24\"")
            .expect("the rule added");
        let dns = saved.find("ports = \"53\"").unwrap();
        let examples = saved.find("# Levels: limits besides").unwrap();
        assert!(dns < added && added < examples, "{saved}");
        // The added rule's derived name is written, to be kept.
        let named = saved.find("name = \"203.0.113.0/24\"").expect("its name");
        assert!(dns < named && named < examples, "{saved}");
        assert_eq!(Config::parse(&saved, "saved").unwrap().file, config.file);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    }

    #[test]
    fn a_group_readable_mode_is_kept_whatever_the_umask() {
        let (_dir, path, mut config) = file_with("[default]\npps = 100\n", 0o640);
        add_rule(&mut config);
        save(Some(&path), &mut config, "added").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o640);
    }

    #[test]
    fn a_file_with_a_password_that_others_may_read_is_refused_and_left_alone() {
        let text = "[cluster]\nredis = [\"redis://:hunter2@127.0.0.1:6379\"]\n";
        for mode in [0o640, 0o604] {
            let (_dir, path, mut config) = file_with(text, mode);
            add_rule(&mut config);
            let error = save(Some(&path), &mut config, "added").unwrap_err();
            assert!(
                error.contains("holds a Redis password") && error.contains("chmod 600"),
                "{error}"
            );
            assert!(!error.contains("hunter2"), "{error}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        }
        // Owner-only: saved.
        let (_dir, path, mut config) = file_with(text, 0o600);
        add_rule(&mut config);
        save(Some(&path), &mut config, "added").unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("hunter2"));
    }
}

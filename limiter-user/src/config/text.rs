//! The configuration file as the operator wrote it, for `--save`: the
//! text edited in place, only where the configuration in force differs
//! from the one the text says, so its comments, order and formatting stay
//! ([`edit_in_place`]); and whether a configuration holds a secret
//! ([`holds_secret`]), which `--save` never leaves readable by others.

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use super::{redact_url, FileConfig};

/// `original`, the file's text that reads as `before`, edited to read as
/// `after`. Each key, table and rule whose value did not change keeps its
/// text and the comments around it; a changed value keeps its key's
/// comments; a rule added goes after the last rule. The result parses to
/// `after` (the callers check it).
pub fn edit_in_place(
    original: &str,
    before: &FileConfig,
    after: &FileConfig,
) -> Result<String, toml_edit::TomlError> {
    let mut doc: DocumentMut = original.parse()?;
    // Both sides in the serializer's own form, so that "changed" means a
    // different value, not a different spelling of it ("60s" and "1m").
    let old: DocumentMut = before.to_toml().parse()?;
    let new: DocumentMut = after.to_toml().parse()?;
    merge_table(doc.as_table_mut(), old.as_table(), new.as_table());
    Ok(doc.to_string())
}

/// Whether `file` holds a password: in a Redis URL or the Sentinel
/// primary's.
pub fn holds_secret(file: &FileConfig) -> bool {
    file.cluster.as_ref().is_some_and(|c| {
        c.primary_password.is_some() || c.redis.iter().any(|url| redact_url(url) != *url)
    })
}

/// Whether two items hold the same TOML value, whatever their formatting.
fn same(a: &Item, b: &Item) -> bool {
    value_of(a) == value_of(b)
}

fn value_of(item: &Item) -> Option<toml::Value> {
    let mut doc = DocumentMut::new();
    doc.insert("x", item.clone());
    let mut table: toml::Table = toml::from_str(&doc.to_string()).ok()?;
    table.remove("x")
}

/// Makes `doc` (the operator's table) say what `new` says where `old`
/// (what `doc` said, in the serializer's form) differs from it.
fn merge_table(doc: &mut Table, old: &Table, new: &Table) {
    let empty = Table::new();
    for (key, new_item) in new.iter() {
        let old_item = old.get(key);
        if old_item.is_some_and(|o| same(o, new_item)) {
            continue;
        }
        match (doc.get_mut(key), new_item) {
            (Some(Item::Table(table)), Item::Table(new_table)) => {
                let old_table = old_item.and_then(Item::as_table).unwrap_or(&empty);
                merge_table(table, old_table, new_table);
            }
            (Some(Item::ArrayOfTables(tables)), Item::ArrayOfTables(new_tables)) => {
                match old_item.and_then(Item::as_array_of_tables) {
                    Some(old_tables) if old_tables.len() == tables.len() => {
                        merge_tables(tables, old_tables, new_tables);
                    }
                    _ => *tables = fresh_tables(new_tables),
                }
            }
            (Some(Item::Value(value)), Item::Value(new_value)) => {
                let decor = value.decor().clone();
                *value = new_value.clone();
                *value.decor_mut() = decor;
            }
            (_, Item::Table(new_table)) => {
                doc.insert(key, Item::Table(fresh_table(new_table)));
            }
            (_, Item::ArrayOfTables(new_tables)) => {
                doc.insert(key, Item::ArrayOfTables(fresh_tables(new_tables)));
            }
            (_, item) => {
                doc.insert(key, item.clone());
            }
        }
    }
    let gone: Vec<String> = old
        .iter()
        .filter(|(key, _)| !new.contains_key(key))
        .map(|(key, _)| key.to_string())
        .collect();
    for key in gone {
        doc.remove(&key);
    }
}

/// `[[rules]]`: each rule of `new` takes the operator's table of an
/// unchanged rule (in order, each once), else that of the rule matching
/// the same traffic when only some of its keys changed (`rule set`, a
/// name written), else a new table.
fn merge_tables(doc: &mut ArrayOfTables, old: &ArrayOfTables, new: &ArrayOfTables) {
    let mut used = vec![false; old.len()];
    let mut out = ArrayOfTables::new();
    for (index, new_table) in new.iter().enumerate() {
        let as_item = |t: &Table| Item::Table(t.clone());
        let unchanged = (0..old.len()).find(|&i| {
            !used[i]
                && old
                    .get(i)
                    .is_some_and(|o| same(&as_item(o), &as_item(new_table)))
        });
        let table = match unchanged {
            Some(i) => {
                used[i] = true;
                doc.get(i).cloned()
            }
            None => None,
        };
        let table = table.or_else(|| {
            // The rule that matched the same traffic, here or elsewhere
            // (a rule removed before it moved it up).
            let i = std::iter::once(index).chain(0..old.len()).find(|&i| {
                i < old.len() && !used[i] && old.get(i).is_some_and(|o| same_match(o, new_table))
            })?;
            let (old_table, table) = (old.get(i)?, doc.get(i)?);
            used[i] = true;
            let mut table = table.clone();
            merge_table(&mut table, old_table, new_table);
            Some(table)
        });
        out.push(table.unwrap_or_else(|| fresh_table(new_table)));
    }
    *doc = out;
}

/// Whether two rules match the same traffic (`cidr`, `protocol`, `ports`,
/// `tcp_syn`): `rule set` replaced the one with the other.
fn same_match(a: &Table, b: &Table) -> bool {
    ["cidr", "protocol", "ports", "tcp_syn"]
        .iter()
        .all(|key| match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) => same(x, y),
            (None, None) => true,
            _ => false,
        })
}

/// A copy of `table` with no place in the operator's document, so that it
/// renders after the table before it rather than where the serializer put
/// it.
fn fresh_table(table: &Table) -> Table {
    let mut out = Table::new();
    for (key, item) in table.iter() {
        let item = match item {
            Item::Table(t) => Item::Table(fresh_table(t)),
            Item::ArrayOfTables(t) => Item::ArrayOfTables(fresh_tables(t)),
            other => other.clone(),
        };
        out.insert(key, item);
    }
    out
}

fn fresh_tables(tables: &ArrayOfTables) -> ArrayOfTables {
    let mut out = ArrayOfTables::new();
    for table in tables.iter() {
        out.push(fresh_table(table));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# The operator's header.

[daemon]
interfaces = [\"eth0\"] # the uplink

# Rules, most specific first.
[default]
pps = 1000   # per source
window = \"1s\"

# The office.
[[rules]]
cidr = \"192.0.2.0/24\"
pps = 50 # a comment on the value

# The partners.
[[rules]]
cidr = \"198.51.100.0/24\"
pps = 200
";

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).expect("parses")
    }

    #[test]
    fn nothing_changed_gives_the_text_back_byte_for_byte() {
        let before = file(TEXT);
        assert_eq!(edit_in_place(TEXT, &before, &before).unwrap(), TEXT);
    }

    #[test]
    fn a_changed_value_keeps_every_comment_and_the_rest_of_the_text() {
        let before = file(TEXT);
        let mut after = before.clone();
        after.rules[0].pps = Some(60);
        let text = edit_in_place(TEXT, &before, &after).unwrap();
        assert_eq!(text, TEXT.replace("pps = 50 #", "pps = 60 #"));
        assert_eq!(file(&text), after);
    }

    #[test]
    fn rules_added_and_removed_leave_the_others_and_their_comments() {
        let before = file(TEXT);
        let mut after = before.clone();
        after.rules.remove(0);
        let mut added = after.rules[0].clone();
        added.cidr = Some("203.0.113.0/24".parse().unwrap());
        added.pps = Some(5);
        after.rules.push(added);
        let text = edit_in_place(TEXT, &before, &after).unwrap();
        assert_eq!(file(&text), after);
        assert!(!text.contains("192.0.2.0/24"), "{text}");
        for kept in [
            "# The operator's header.",
            "interfaces = [\"eth0\"] # the uplink",
            "pps = 1000   # per source",
            "# The partners.",
        ] {
            assert!(text.contains(kept), "lost {kept:?}:\n{text}");
        }
        let partners = text.find("198.51.100.0/24").unwrap();
        let added = text.find("203.0.113.0/24").unwrap();
        assert!(partners < added, "{text}");
    }

    #[test]
    fn secrets_are_passwords_in_urls_or_the_primarys() {
        let plain = "[cluster]\nredis = [\"redis://user@127.0.0.1:6379\"]\n";
        assert!(!holds_secret(&file(plain)));
        let url = "[cluster]\nredis = [\"redis://user:pw@127.0.0.1:6379\"]\n";
        assert!(holds_secret(&file(url)));
        let primary = "[cluster]\nredis = [\"redis://127.0.0.1:26379\"]\nmode = \"sentinel\"\n\
                       sentinel_master = \"m\"\nprimary_password = \"pw\"\n";
        assert!(holds_secret(&file(primary)));
        assert!(!holds_secret(&file("")));
    }
}

//! `[[lists]]`: prefixes to allow or deny before any rule, read from files
//! (`file`) and the configuration (`prefixes`), merged into the entries
//! the kernel's list tries hold (`kernel::lists` writes them).
//!
//! A list file holds one prefix a line (a bare address is its /32 or
//! /128); `#` and `;` start comments (FireHOL, Spamhaus DROP); ipset-save
//! lines (`add SET 192.0.2.0/24`) give their prefix and `create` lines
//! are skipped. Host bits set are cleared (`192.0.2.1/24` is
//! `192.0.2.0/24`), as ipset does.

mod file;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ipnet::IpNet;
use limiter_common::lists::{ListAction, ListRef, MAX_LISTS};

pub use self::file::parse;
use crate::config::{ListKind, ListSection};

/// Why a list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("list {list}: cannot read {path}: {source}")]
    Read {
        list: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("list {list}: {origin} line {line}: {message}")]
    Line {
        list: String,
        origin: String,
        line: usize,
        message: String,
    },
    #[error(
        "the lists hold {count} {family} prefixes, more than daemon.max_list_prefixes \
         ({max}); raise it (restart) or shorten the lists"
    )]
    TooMany {
        family: &'static str,
        count: usize,
        max: u32,
    },
    #[error("at most {MAX_LISTS} lists")]
    TooManyLists,
}

/// One list as read: its name, what it does and its prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List {
    pub name: String,
    pub action: ListAction,
    /// Where its prefixes came from (`None`: only the configuration).
    pub file: Option<PathBuf>,
    pub prefixes: Vec<IpNet>,
}

/// Reads every list of `sections`; a relative `file` is taken from
/// `base` (the configuration file's directory).
pub fn read_all(sections: &[ListSection], base: Option<&Path>) -> Result<Vec<List>, ListError> {
    if sections.len() > MAX_LISTS {
        return Err(ListError::TooManyLists);
    }
    sections.iter().map(|s| read(s, base)).collect()
}

fn read(section: &ListSection, base: Option<&Path>) -> Result<List, ListError> {
    let line_error = |origin: &str, (line, message): (usize, String)| ListError::Line {
        list: section.name.clone(),
        origin: origin.to_string(),
        line,
        message,
    };
    let mut prefixes = Vec::new();
    for (i, text) in section.prefixes.iter().enumerate() {
        let found = parse(text).map_err(|e| line_error("prefixes", (i + 1, e.1)))?;
        prefixes.extend(found);
    }
    let file = section.file.as_ref().map(|file| match base {
        Some(base) if file.is_relative() => base.join(file),
        _ => file.clone(),
    });
    if let Some(path) = &file {
        let text = std::fs::read_to_string(path).map_err(|source| ListError::Read {
            list: section.name.clone(),
            path: path.clone(),
            source,
        })?;
        prefixes.extend(parse(&text).map_err(|e| line_error(&path.display().to_string(), e))?);
    }
    Ok(List {
        name: section.name.clone(),
        action: match section.action {
            ListKind::Allow => ListAction::Allow,
            ListKind::Deny => ListAction::Deny,
        },
        file,
        prefixes,
    })
}

/// The entries of the list tries: (prefix length, address) -> the list
/// that holds it, the first list of the configuration where two hold the
/// same prefix; and how many distinct prefixes each list holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub v4: Vec<(u8, [u8; 4], ListRef)>,
    pub v6: Vec<(u8, [u8; 16], ListRef)>,
    /// Prefixes per list, in configuration order (a prefix an earlier
    /// list holds too counts for that one only).
    pub counts: Vec<usize>,
}

/// Merges `lists` into trie entries, refusing more than `max` prefixes of
/// a family.
pub fn merge(lists: &[List], max: u32) -> Result<Merged, ListError> {
    let mut v4 = BTreeMap::new();
    let mut v6 = BTreeMap::new();
    let mut counts = vec![0; lists.len()];
    for (index, list) in lists.iter().enumerate() {
        let value = ListRef::new(index as u8, list.action);
        for net in &list.prefixes {
            let first = match net.trunc() {
                IpNet::V4(n) => keep_first(&mut v4, (n.prefix_len(), n.addr().octets()), value),
                IpNet::V6(n) => keep_first(&mut v6, (n.prefix_len(), n.addr().octets()), value),
            };
            counts[index] += usize::from(first);
        }
    }
    for (family, count) in [("IPv4", v4.len()), ("IPv6", v6.len())] {
        if count > max as usize {
            return Err(ListError::TooMany { family, count, max });
        }
    }
    Ok(Merged {
        v4: v4.into_iter().map(|((len, a), r)| (len, a, r)).collect(),
        v6: v6.into_iter().map(|((len, a), r)| (len, a, r)).collect(),
        counts,
    })
}

/// Inserts `value` at `key` unless an earlier list holds it: whether it
/// was inserted.
fn keep_first<K: Ord>(map: &mut BTreeMap<K, ListRef>, key: K, value: ListRef) -> bool {
    match map.entry(key) {
        std::collections::btree_map::Entry::Vacant(entry) => {
            entry.insert(value);
            true
        }
        std::collections::btree_map::Entry::Occupied(_) => false,
    }
}

#[cfg(test)]
mod tests;

//! The live rule table: for each `RULES` index of the generation in force
//! and of the one before it (each in its own half of the map), its rule's
//! stable name and, for a rule with levels, their labels. Built once a
//! push from the validated rules ([`RuleTable::replace`]) and shared
//! ([`SharedRuleTable`]) with the event watchers and the cluster sync, so
//! every counter and event of either generation resolves to one name and
//! nothing keeps a copy of its own.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use limiter_common::rules::MAX_RULES;

use super::metrics::RuleLevels;
use crate::rules::RuleSet;

/// The table, shared between the daemon's loop (which replaces it on each
/// push), the event watchers and the cluster sync (which read it).
pub type SharedRuleTable = Arc<RwLock<RuleTable>>;

/// `RULES` index -> the rule there.
#[derive(Debug, Default)]
pub struct RuleTable {
    rules: BTreeMap<u32, Entry>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    /// Its levels, for a rule that has any.
    levels: Option<RuleLevels>,
}

impl RuleTable {
    /// Replaces the half of the generation pushed at `base` with `rules`
    /// (the other half, the generation before, stays readable).
    pub fn replace(&mut self, rules: &RuleSet, base: u32) {
        self.rules
            .retain(|index, _| !(base..base + MAX_RULES).contains(index));
        for (i, spec) in rules.specs().enumerate() {
            let index = base + i as u32;
            let levels = (!spec.levels.is_empty()).then(|| RuleLevels {
                index,
                rule: spec.name.clone(),
                labels: spec
                    .levels
                    .iter()
                    .map(|level| level.label(spec.limits.window))
                    .collect(),
            });
            self.rules.insert(
                index,
                Entry {
                    name: spec.name.clone(),
                    levels,
                },
            );
        }
    }

    /// The name of the rule at `index`.
    pub fn name(&self, index: u32) -> Option<&str> {
        self.rules.get(&index).map(|e| e.name.as_str())
    }

    /// The label of the rule at `index`'s level `level` (0: its first
    /// level, as `LimitEvent::level` counts).
    pub fn level_label(&self, index: u32, level: usize) -> Option<&str> {
        let levels = self.rules.get(&index)?.levels.as_ref()?;
        levels.labels.get(level).map(String::as_str)
    }

    /// Every index with its rule's name, both generations.
    pub fn names(&self) -> Vec<(u32, String)> {
        self.rules
            .iter()
            .map(|(index, e)| (*index, e.name.clone()))
            .collect()
    }

    /// The indices and names of the generation pushed at `base`.
    pub fn generation(&self, base: u32) -> impl Iterator<Item = (u32, &str)> {
        self.rules
            .range(base..base + MAX_RULES)
            .map(|(index, e)| (*index, e.name.as_str()))
    }

    /// The rules with levels, both generations.
    pub fn levels(&self) -> impl Iterator<Item = &RuleLevels> {
        self.rules.values().filter_map(|e| e.levels.as_ref())
    }

    /// A rule at `index` with levels labelled `labels`, for tests.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, index: u32, name: &str, labels: &[&str]) {
        let levels = RuleLevels {
            index,
            rule: name.into(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        };
        self.rules.insert(
            index,
            Entry {
                name: name.into(),
                levels: Some(levels),
            },
        );
    }

    /// Whether any rule of either generation has levels.
    pub fn has_levels(&self) -> bool {
        self.levels().next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use limiter_common::rules::rules_base;

    use super::*;
    use crate::config::Config;

    fn rules(text: &str) -> RuleSet {
        Config::parse(text, "test").expect("a valid file").rules
    }

    #[test]
    fn a_push_replaces_its_half_and_keeps_the_generation_before() {
        let mut table = RuleTable::default();
        let first = rules(
            "[daemon]\ninterfaces = [\"eth0\"]\n\n[[rules]]\nname = \"web\"\ncidr = \"192.0.2.0/24\"\npps = 10\nlevels = [\"prefix/24/48:100\"]\n",
        );
        let (a, b) = (rules_base(0), rules_base(1));
        table.replace(&first, a);
        assert_eq!(table.name(a), Some("default"));
        assert_eq!(table.name(a + 1), Some("web"));
        assert_eq!(table.level_label(a + 1, 0), Some("prefix/24/48@1s"));
        assert_eq!(table.level_label(a + 1, 1), None);
        assert_eq!(table.level_label(a, 0), None, "the default has none");
        assert!(table.has_levels());

        let second = rules("[daemon]\ninterfaces = [\"eth0\"]\n");
        table.replace(&second, b);
        // The generation before still names its counters and events.
        assert_eq!(table.name(a + 1), Some("web"));
        assert_eq!(table.generation(b).collect::<Vec<_>>(), [(b, "default")]);
        // A third push lands in the first half: `web` is gone with it.
        table.replace(&second, a);
        assert_eq!(table.name(a + 1), None);
        assert!(!table.has_levels());
        assert_eq!(table.names().len(), 2);
    }
}

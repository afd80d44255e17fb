//! The program's maps, opened once after loading into typed handles (as
//! bpf2go does for Go programs): callers use `maps.rules`, never a map name
//! string, and a map of the wrong kind or value size is refused at load,
//! not at first use.
//!
//! `Maps` is generated from the table of maps
//! (`limiter_common::for_each_map!`): a field per row the daemon uses,
//! named by the row, of the aya type of its kind.

use aya::{
    maps::{
        Array, HashMap, IterableMap, LpmTrie, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf,
    },
    Ebpf,
};
use limiter_common::{
    names,
    tickets::{self, Rooms},
    Config, Rule, SourceKey, WindowState,
};

use std::path::Path;

use super::MapsError;

/// Moves map `name` out of `ebpf` as `T`.
fn take<T: TryFrom<Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, MapsError> {
    let map = ebpf.take_map(name).ok_or(MapsError::Missing(name))?;
    T::try_from(map).map_err(MapsError::on(name))
}

/// Opens map `name` pinned in `dir` as `T`.
fn pinned<T: TryFrom<Map, Error = aya::maps::MapError>>(
    dir: &Path,
    name: &'static str,
) -> Result<T, MapsError> {
    let data = MapData::from_pin(dir.join(name)).map_err(MapsError::on(name))?;
    let map = Map::from_map_data(data).map_err(MapsError::on(name))?;
    T::try_from(map).map_err(MapsError::on(name))
}

/// The aya type of a handle on a map of `$kind` (an LRU hash reads as a
/// plain one).
macro_rules! handle_type {
    (LruPerCpuHash, $key:ty, $value:ty) => { PerCpuHashMap<MapData, $key, $value> };
    (LruHash, $key:ty, $value:ty) => { HashMap<MapData, $key, $value> };
    (Hash, $key:ty, $value:ty) => { HashMap<MapData, $key, $value> };
    (Array, $key:ty, $value:ty) => { Array<MapData, $value> };
    (PerCpuArray, $key:ty, $value:ty) => { PerCpuArray<MapData, $value> };
    (LpmTrie, $key:ty, $value:ty) => { LpmTrie<MapData, $key, $value> };
    (RingBuf, $key:ty, $value:ty) => { RingBuf<MapData> };
}

/// A field's type: a pinned map's handle, or a taken map's, which has one
/// owner (`None` once taken, and in handles opened from pins).
macro_rules! field_type {
    (pinned, $kind:ident, $key:ty, $value:ty) => { handle_type!($kind, $key, $value) };
    (taken, $kind:ident, $key:ty, $value:ty) => { Option<handle_type!($kind, $key, $value)> };
}

/// A field's value in `Maps::take`.
macro_rules! take_field {
    (pinned, $ebpf:ident, $name:ident) => {
        take($ebpf, names::$name)?
    };
    (taken, $ebpf:ident, $name:ident) => {
        Some(take($ebpf, names::$name)?)
    };
}

/// A field's value in `Maps::from_pins`.
macro_rules! pinned_field {
    (pinned, $dir:ident, $name:ident) => {
        pinned($dir, names::$name)?
    };
    (taken, $dir:ident, $name:ident) => {
        None
    };
}

/// `Maps` from the table's rows: the kernel-only rows are skipped one by
/// one, the others gathered, then `Maps` and its constructors made of
/// them.
macro_rules! user_maps {
    (@gather [$($gathered:tt)*]) => {
        user_maps!(@make $($gathered)*);
    };
    (@gather [$($gathered:tt)*]
        $(#[$doc:meta])*
        $name:ident($field:ident): $kind:ident<$key:ty, $value:ty>,
            $sizing:ident($max_entries:expr), kernel;
        $($rest:tt)*
    ) => {
        user_maps!(@gather [$($gathered)*] $($rest)*);
    };
    (@gather [$($gathered:tt)*]
        $(#[$doc:meta])*
        $name:ident($field:ident): $kind:ident<$key:ty, $value:ty>,
            $sizing:ident($max_entries:expr), taken;
        $($rest:tt)*
    ) => {
        user_maps!(@gather [$($gathered)* {
            $(#[$doc])*
            ///
            /// `None` once taken (its one reader owns it), and in handles
            /// opened from pins.
            $name $field taken $kind $key, $value
        }] $($rest)*);
    };
    (@gather [$($gathered:tt)*]
        $(#[$doc:meta])*
        $name:ident($field:ident): $kind:ident<$key:ty, $value:ty>,
            $sizing:ident($max_entries:expr), pinned;
        $($rest:tt)*
    ) => {
        user_maps!(@gather [$($gathered)* {
            $(#[$doc])* $name $field pinned $kind $key, $value
        }] $($rest)*);
    };
    (@make $({
        $(#[$doc:meta])* $name:ident $field:ident $keep:ident $kind:ident $key:ty, $value:ty
    })*) => {
        /// Typed handles on every map userspace uses (the kernel's scratch
        /// and budget maps stay inside the object).
        pub struct Maps {
            $(
                $(#[$doc])*
                pub $field: field_type!($keep, $kind, $key, $value),
            )*
        }

        impl Maps {
            /// How many maps a `Maps` holds.
            pub const COUNT: usize = [$(stringify!($field)),*].len();

            /// Moves the maps out of a freshly loaded object.
            pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, MapsError> {
                Ok(Self {
                    $($field: take_field!($keep, ebpf, $name),)*
                })
            }

            /// A second set of handles on a running instance's maps, from
            /// their pins in `maps_dir` (`pins::maps_dir`), for a task that
            /// works beside the daemon's main loop (the cluster sync).
            /// Without the maps that are not pinned (`EVENTS`, which has one
            /// reader).
            pub fn from_pins(maps_dir: &Path) -> Result<Self, MapsError> {
                Ok(Self {
                    $($field: pinned_field!($keep, maps_dir, $name),)*
                })
            }
        }
    };
    ($($rows:tt)*) => {
        user_maps!(@gather [] $($rows)*);
    };
}

limiter_common::for_each_map!(user_maps);

impl Maps {
    /// The live configuration (generation 0: nothing pushed yet).
    pub fn live_config(&self) -> Result<Config, MapsError> {
        self.config.get(&0, 0).map_err(MapsError::on(names::CONFIG))
    }

    /// The shared window of `wkey` (a window key: the source with its
    /// rule's budget as class), as the kernel finds it.
    pub fn window(&self, wkey: &SourceKey) -> Option<WindowState> {
        self.windows.get(wkey, 0).ok()
    }

    /// Until when (the kernel's clock, ns; 0: never) the kernel found the
    /// windows' tickets (`UNPROVEN`) all taken.
    pub fn tickets_taken_until(&self) -> u64 {
        self.pressure.get(&1, 0).unwrap_or(0)
    }

    /// The rooms of the windows' tickets (`TICKET_CLOCK`).
    pub fn ticket_rooms(&self) -> Result<Rooms, MapsError> {
        let word = |index| {
            self.ticket_clock
                .get(&index, 0)
                .map_err(MapsError::on(names::TICKET_CLOCK))
        };
        Ok(Rooms {
            reserve: word(tickets::CLOCK_RESERVE)?,
            shared: word(tickets::CLOCK_SHARED)?,
            prefix: word(tickets::CLOCK_PREFIX)?,
            proven: word(tickets::CLOCK_CAPACITY)? / u64::from(limiter_common::maps::PROVEN_SHARE),
        })
    }

    /// Sets the tickets there are (`capacity`), their ring's length (the
    /// windows there are: proven ones take tickets too) and their rooms,
    /// for `rules` rules.
    pub fn set_ticket_rooms(&mut self, capacity: u32, rules: u32) -> Result<(), MapsError> {
        let rooms = Rooms::new(capacity, rules);
        for (index, word) in [
            (tickets::CLOCK_CAPACITY, u64::from(capacity)),
            (
                tickets::CLOCK_RING,
                u64::from(limiter_common::maps::window_capacity(capacity)),
            ),
            (tickets::CLOCK_RESERVE, rooms.reserve),
            (tickets::CLOCK_SHARED, rooms.shared),
            (tickets::CLOCK_PREFIX, rooms.prefix),
        ] {
            self.ticket_clock
                .set(index, word, 0)
                .map_err(MapsError::on(names::TICKET_CLOCK))?;
        }
        Ok(())
    }

    /// The tickets' capacity (`max_sources`, as loaded).
    pub fn ticket_capacity(&self) -> Result<u32, MapsError> {
        self.ticket_clock
            .get(&tickets::CLOCK_CAPACITY, 0)
            .map(|words| words as u32)
            .map_err(MapsError::on(names::TICKET_CLOCK))
    }

    /// The tickets each account holds (`tickets::ACCOUNTS` of them: the
    /// rule slots', then the shared room's and the proven room's).
    pub fn tickets_held(&self) -> Result<Vec<u64>, MapsError> {
        words_held(&self.ticket_counts, names::TICKET_COUNTS)
    }

    /// The tickets on each cell of `PREFIX_TICKETS` (both rows, in index
    /// order); a prefix holds the lesser of its two cells'.
    pub fn prefix_tickets_held(&self) -> Result<Vec<u64>, MapsError> {
        words_held(&self.prefix_tickets, names::PREFIX_TICKETS)
    }

    /// Deletes the tickets of the windows `wkeys` that have one, and
    /// counts each given back to its account and its prefix's cells (the
    /// daemon's own words).
    pub fn remove_tickets(&mut self, wkeys: &[SourceKey]) -> Result<(), MapsError> {
        let mut returned = std::collections::BTreeMap::<u16, u64>::new();
        let mut cells = std::collections::BTreeMap::<u16, u64>::new();
        for wkey in wkeys {
            let Ok(ticket) = self.unproven.get(wkey, 0) else {
                continue;
            };
            // An error: the program freed it first (and counted it).
            if self.unproven.remove(wkey).is_ok() {
                *returned.entry(ticket.account()).or_default() += 1;
                for cell in ticket.cells().into_iter().flatten() {
                    *cells.entry(cell).or_default() += 1;
                }
            }
        }
        let returned = returned
            .into_iter()
            .map(|(account, n)| (tickets::returned_index(account), n));
        add_to_words(&mut self.ticket_counts, names::TICKET_COUNTS, returned)?;
        let cells = cells
            .into_iter()
            .map(|(cell, n)| (tickets::prefix_returned_index(cell), n));
        add_to_words(&mut self.prefix_tickets, names::PREFIX_TICKETS, cells)
    }

    /// The rule at `RULES` index `index`.
    pub fn rule(&self, index: u32) -> Result<Rule, MapsError> {
        self.rules
            .get(&index, 0)
            .map_err(MapsError::on(names::RULES))
    }

    /// The map data of `SOURCES`, for batched reads.
    pub fn sources_data(&self) -> &MapData {
        self.sources.map()
    }

    /// The sketch's map, for batched reads.
    pub fn sketch_data(&self) -> &MapData {
        self.sketch.map()
    }

    /// The map data of `SHARE_MARKS`, for batched reads and writes.
    pub fn share_marks_data(&self) -> &MapData {
        self.share_marks.map()
    }

    /// The map data of `CLUSTER_SHARES`, for batched writes.
    pub fn cluster_shares_data(&self) -> &MapData {
        self.cluster_shares.map()
    }
}

/// What each counter of `array` (the map `name`) holds: its first half
/// of words are the kernel's counts taken, its second the daemon's
/// returned, counter by counter.
fn words_held(array: &Array<MapData, u64>, name: &'static str) -> Result<Vec<u64>, MapsError> {
    let words: Vec<u64> = array
        .iter()
        .collect::<Result<_, _>>()
        .map_err(MapsError::on(name))?;
    let (taken, returned) = words.split_at(words.len() / 2);
    Ok(taken
        .iter()
        .zip(returned)
        .map(|(taken, returned)| taken.wrapping_sub(*returned))
        .collect())
}

/// Adds each `(index, n)` of `adds` to the word of `array` (the map
/// `name`) at `index`: the daemon's own words, which no one else writes.
fn add_to_words(
    array: &mut Array<MapData, u64>,
    name: &'static str,
    adds: impl IntoIterator<Item = (u32, u64)>,
) -> Result<(), MapsError> {
    for (index, n) in adds {
        let before = array.get(&index, 0).map_err(MapsError::on(name))?;
        array
            .set(index, before.wrapping_add(n), 0)
            .map_err(MapsError::on(name))?;
    }
    Ok(())
}

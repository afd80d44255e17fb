//! The table of every map of the XDP program: one row per map, the only
//! place a map is declared.
//!
//! [`for_each_map!`](crate::for_each_map) hands every row to a macro of
//! the caller's (the "callback macro" pattern), which makes of them what
//! its crate needs: this crate the [`MapSpec`](super::MapSpec) constants,
//! [`ALL`](super::ALL) and [`names`](super::names); the kernel crate its
//! map statics; the daemon its typed handles (`Maps`). Adding a map is
//! adding a row here.

/// Calls `$callback!` with every row of the map table, in table order.
///
/// A row is
///
/// ```text
/// #[doc = ...]*
/// NAME(field): Kind<K, V>, Sizing(default_max_entries), keep;
/// ```
///
/// - `NAME`: the map's name in the object, the kernel static's name and
///   the constant of its `MapSpec`; `field`: the name of its handle in
///   userspace's `Maps`.
/// - `Kind`: a [`MapKind`](crate::maps::MapKind) variant. `K` is the key
///   as the map is declared: an array's `u32` index; the key data of an
///   LPM trie, without the 4-byte prefix length the kernel puts before
///   it; `()` for a ring buffer, whose value is `()` too (it carries no
///   typed values).
/// - `Sizing`: a [`Sizing`](crate::maps::Sizing) variant, with the
///   capacity the object defines (bytes, for a ring buffer).
/// - `keep`: `pinned` (the daemon pins it and opens a handle on it),
///   `taken` (not pinned: its one reader takes its handle) or `kernel`
///   (per-CPU scratch and budgets that only the kernel touches).
///
/// Types are written with `$crate::` paths so that rows expand in any
/// crate.
#[macro_export]
macro_rules! for_each_map {
    ($callback:ident) => {
        $callback! {
            /// Offered traffic per source, one slot per CPU so counting never
            /// shares a cache line: `SourceKey` -> `SourceTraffic`, for the hot
            /// sources (every source with the tiers off). LRU: when full, the
            /// least recently seen source is evicted.
            SOURCES(sources): LruPerCpuHash<$crate::SourceKey, $crate::SourceTraffic>,
                HotSources($crate::maps::DEFAULT_MAX_HOT_SOURCES), pinned;

            /// Admission windows per source and rule budget, shared by all CPUs
            /// (written only when a frame is admitted): `SourceKey` ->
            /// `WindowState`. A plain hash, which never evicts: a window is kept
            /// until the daemon finds it idle for its longest possible length
            /// (`WindowState::idle_at`), so no flood of other sources can take a
            /// source's count away. Full, a source that needs a new window is
            /// refused (`Outcome::WindowFull`): it gets its cheap frames, never
            /// an uncounted admission more.
            WINDOWS(windows): Hash<$crate::SourceKey, $crate::WindowState>,
                Windows($crate::maps::DEFAULT_MAX_SOURCES + $crate::maps::DEFAULT_MAX_SOURCES / $crate::maps::PROVEN_SHARE), pinned;

            /// The tickets of the windows made under pressure: `SourceKey` (the
            /// window's key) -> `tickets::Ticket`: the account it was taken
            /// from (its rule's slot or the shared room: `tickets::Rooms`; or
            /// the proven room, `tickets::PROVEN`) and its /48's cells in
            /// `PREFIX_TICKETS`. A window is made for a source that has not
            /// proved its address only with a ticket of a rule's rooms, and
            /// there are `max_sources` of them, while `WINDOWS` holds a quarter
            /// more: that quarter is kept for TCP sources that completed a
            /// handshake with a valid SYN cookie while the tickets were all
            /// taken (`Outcome::Proven`, `judge/proof.rs`), which a spoofed
            /// flood, never receiving our SYN-ACKs, cannot take; such a window
            /// gets a ticket of the proven room, so its /48 is counted and the
            /// program frees it idle as any other. A plain hash of `WINDOWS`'
            /// size; the daemon deletes a window's ticket with the window.
            /// Full, or the rule's reserve and the shared room taken, a source
            /// without a window gets none (`Outcome::WindowFull`) unless it
            /// proves itself.
            UNPROVEN(unproven): Hash<$crate::SourceKey, $crate::tickets::Ticket>,
                Windows($crate::maps::DEFAULT_MAX_SOURCES + $crate::maps::DEFAULT_MAX_SOURCES / $crate::maps::PROVEN_SHARE), pinned;

            /// The tickets in the order they were taken (the window keys), a
            /// ring of `WINDOWS`' size: when no ticket is left, the program
            /// looks at the oldest entries, frees the window and ticket of one
            /// found idle (`WindowState::idle_at`) and puts a busy one back at
            /// the end (`judge/tickets.rs`), so windows are freed with no
            /// daemon running. Full (more entries than it holds), the oldest
            /// entry is written over: its window is left to the daemon's
            /// reclaim.
            TICKET_RING(ticket_ring): Array<u32, $crate::SourceKey>,
                Windows($crate::maps::DEFAULT_MAX_SOURCES + $crate::maps::DEFAULT_MAX_SOURCES / $crate::maps::PROVEN_SHARE), pinned;

            /// `[entries appended to TICKET_RING, entries looked at, the
            /// tickets there are, each rule's reserve of tickets, the shared
            /// room, until when the ring rests, a prefix's room, the ring's
            /// length]` (`tickets::CLOCK_*`): the ring's two counters
            /// (compare-and-swap), the tickets and the ring's length (written by
            /// userspace at load; a length of 0: no ring) and the rooms
            /// (`tickets::Rooms`, written at each rule push).
            TICKET_CLOCK(ticket_clock): Array<u32, u64>,
                Fixed($crate::tickets::CLOCK_WORDS), pinned;

            /// The tickets each account holds (`tickets`): per rule slot, the
            /// shared room and the proven room, what the program took net of
            /// what it gave back (atomic adds), then what the daemon's reclaim
            /// gave back (its own words). Fixed: 1,028 words.
            TICKET_COUNTS(ticket_counts): Array<u32, u64>,
                Fixed($crate::tickets::COUNTS), pinned;

            /// The tickets each IPv6 /48 holds (`tickets::prefix_cells`: a
            /// count-min sketch of two rows of 4,096 cells): per cell, what the
            /// program took net of what it gave back (atomic adds), then what
            /// the daemon's reclaim gave back (its own words). A prefix whose
            /// cells both read `tickets::Rooms::prefix` gets no ticket more
            /// (`Outcome::PrefixFull`). Fixed: 16,384 words.
            PREFIX_TICKETS(prefix_tickets): Array<u32, u64>,
                Fixed($crate::tickets::PREFIX_WORDS), pinned;

            /// Per-CPU scratch for a new `WINDOWS` value, too large for the BPF
            /// stack: all zero between uses, seeded, inserted and zeroed again
            /// (`limiter-ebpf/src/judge/scratch.rs`).
            WINDOW_SEED(window_seed): PerCpuArray<u32, $crate::WindowState>,
                Fixed(1), kernel;

            /// Per-CPU scratch for a new `SOURCES` value, too large for the BPF
            /// stack: all zero between uses, filled, inserted and zeroed again
            /// (`limiter-ebpf/src/judge/scratch.rs`).
            TRAFFIC_SEED(traffic_seed): PerCpuArray<u32, $crate::SourceTraffic>,
                Fixed(1), kernel;

            /// Per-CPU scratch holding the key of the frame being judged, off the
            /// stack.
            FRAME_KEY(frame_key): PerCpuArray<u32, $crate::SourceKey>,
                Fixed(1), kernel;

            /// Per-CPU scratch holding what the frame being judged may claim
            /// should its source find no window and no ticket (`judge/proof.rs`:
            /// `LIMIT_PROVEN`, `LIMIT_SYN_PASSES`), and its source's reading in
            /// the sketch with the marks taken off (`u32::MAX`: none), written
            /// for every frame before it is judged and read by `limit`.
            FRAME_CLAIMS(frame_claims): PerCpuArray<u32, [u32; 2]>,
                Fixed(1), kernel;

            /// Per-CPU scratch holding the destination address of the frame
            /// being judged (its bytes in order, as four words; IPv4 in the
            /// first), written only while a rule has a level keyed by it
            /// (`Config::destinations`).
            FRAME_DST(frame_dst): PerCpuArray<u32, [u32; 4]>,
                Fixed(1), kernel;

            /// Global per-CPU counters by `Outcome`.
            STATS(stats): PerCpuArray<u32, $crate::Counter>,
                Fixed($crate::Outcome::COUNT), pinned;

            /// The global `Config` (an array of one).
            CONFIG(config): Array<u32, $crate::Config>,
                Fixed(1), pinned;

            /// Compiled `Rule`s in two generations' halves, so that a rule change
            /// writes the half no source resolves into before the generation
            /// bump makes it live.
            RULES(rules): Array<u32, $crate::Rule>,
                Fixed($crate::rules::RULE_SLOTS), pinned;

            /// Frames dropped (or would-be dropped) per `RULES` index, per CPU.
            RULE_DROPS(rule_drops): PerCpuArray<u32, u64>,
                Fixed($crate::rules::RULE_SLOTS), pinned;

            /// Frames dropped (or would-be dropped) per `RULES` index and level
            /// (`index * MAX_LEVELS + level`), per CPU: which of a rule's
            /// levels refused them (`rules::level`).
            LEVEL_DROPS(level_drops): PerCpuArray<u32, u64>,
                Fixed($crate::rules::RULE_SLOTS * $crate::rules::MAX_LEVELS as u32), pinned;

            /// The windows of rules' levels (`rules::level`), shared by all
            /// CPUs: `LevelKey` -> `LevelWindow`. A plain hash, which never
            /// evicts (the daemon reclaims idle ones, as it does `WINDOWS`), so
            /// no flood of other prefixes can take an aggregate's count away.
            /// Full, an aggregate without a window is judged on its level's
            /// overflow cell (`AGG_CELLS`, `Outcome::AggregateFull`).
            AGGREGATES(aggregates): Hash<$crate::LevelKey, $crate::rules::LevelWindow>,
                Sources($crate::maps::DEFAULT_MAX_SOURCES), pinned;

            /// The overflow cells of rules' levels: `LevelKey::cell` ->
            /// `LevelWindow`, the window an aggregate without one of its own is
            /// judged on while `AGGREGATES` is full, shared by every such
            /// aggregate of its level that hashes to it (it counts all their
            /// frames: none of them gets more than its allowance). A plain hash,
            /// reclaimed idle by the daemon; full, such a frame is refused
            /// (`Outcome::InsertFailure`).
            AGG_CELLS(agg_cells): Hash<$crate::LevelKey, $crate::rules::LevelWindow>,
                Fixed($crate::rules::AGG_CELLS), pinned;

            /// Until when (ns, 0: never) the kernel found `AGGREGATES` full
            /// (index 0): an aggregate created before then starts with its
            /// overflow cell's counts (`Outcome::FullSeeded`), so nothing it was
            /// admitted on the cell is admitted again; and until when it found
            /// the tickets of `UNPROVEN` all taken (index 1): while it holds, a
            /// TCP ACK of a source without per-CPU state is checked for a SYN
            /// cookie (`judge/proof.rs`).
            PRESSURE(pressure): Array<u32, u64>,
                Fixed(2), pinned;

            /// Per-CPU scratch for a new `AGGREGATES` value, too large for the
            /// BPF stack: all zero between uses (`judge/scratch.rs`).
            LEVEL_SEED(level_seed): PerCpuArray<u32, $crate::rules::LevelWindow>,
                Fixed(1), kernel;

            /// IPv4 rule prefixes of both generations, keyed by the generation's
            /// half then the prefix (`rules::PrefixKeyV4`) -> `RuleRefs`. The
            /// live half always holds 0.0.0.0/0 once rules are loaded.
            PREFIXES_V4(prefixes_v4): LpmTrie<$crate::rules::PrefixKeyV4, $crate::RuleRefs>,
                Fixed(4096), pinned;

            /// IPv6 rule prefixes of both generations (`rules::PrefixKeyV6`) ->
            /// `RuleRefs`. The live half always holds ::/0 once rules are loaded.
            PREFIXES_V6(prefixes_v6): LpmTrie<$crate::rules::PrefixKeyV6, $crate::RuleRefs>,
                Fixed(4096), pinned;

            /// IPv4 prefixes of the `[[lists]]`, in two halves like the rule
            /// tries (`lists`): `rules::PrefixKeyV4` -> `ListRef`. Twice
            /// `max_list_prefixes`: the next lists are written beside the live
            /// ones. Full, a list load fails as a whole and the live lists stay.
            LISTS_V4(lists_v4): LpmTrie<$crate::rules::PrefixKeyV4, $crate::lists::ListRef>,
                Lists($crate::lists::DEFAULT_MAX_LIST_PREFIXES * 2), pinned;

            /// IPv6 prefixes of the `[[lists]]` (`rules::PrefixKeyV6`) -> `ListRef`.
            LISTS_V6(lists_v6): LpmTrie<$crate::rules::PrefixKeyV6, $crate::lists::ListRef>,
                Lists($crate::lists::DEFAULT_MAX_LIST_PREFIXES * 2), pinned;

            /// Which IPv4 /24s any list prefix touches, a bit each (word: the
            /// address's top 18 bits, bit: the next 6): a source whose /24 no
            /// list touches skips the trie walk. A superset of the live lists'
            /// /24s while they switch (`lists::v4_spans`).
            LISTED_24S(listed_24s): Array<u32, u64>,
                Fixed($crate::lists::SPAN_WORDS), pinned;

            /// Frames judged by each list (index: the list's position in the
            /// configuration), per CPU.
            LIST_HITS(list_hits): PerCpuArray<u32, $crate::Counter>,
                Fixed($crate::lists::MAX_LISTS as u32), pinned;

            /// IPv4 bans: the prefix's address -> `Ban` (its end by the kernel's
            /// clock). Pinned: bans outlive the daemon. Full, a new ban is
            /// refused with an error (`lists::MAX_BANS`).
            BANS_V4(bans_v4): LpmTrie<[u8; 4], $crate::lists::Ban>,
                Fixed($crate::lists::MAX_BANS), pinned;

            /// IPv6 bans: the prefix's address -> `Ban`.
            BANS_V6(bans_v6): LpmTrie<[u8; 16], $crate::lists::Ban>,
                Fixed($crate::lists::MAX_BANS), pinned;

            /// Ring buffer of `LimitEvent`s (its capacity in bytes): "source
            /// limited" events for the daemon's log, and "cluster hot" reports
            /// for its cluster sync.
            EVENTS(events): RingBuf<(), ()>,
                Fixed(64 * 1024), taken;

            /// Per CPU: `[second, "source limited" events sent in it, "cluster
            /// hot" reports sent in it]`, the events' rate limits (one budget per
            /// kind, so that a flood of refused sources cannot starve the
            /// cluster's reports).
            EVENT_BUDGET(event_budget): PerCpuArray<u32, [u64; 3]>,
                Fixed(1), kernel;

            /// The cold tier's counters (`sketch`): one row shared by every CPU,
            /// each entry the words of the last two epochs (`sketch::Pair`).
            SKETCH(sketch): Array<u32, $crate::sketch::Pair>,
                Fixed($crate::sketch::WORDS), pinned;

            /// The share marks: cell (`sketch::mark_cell` of `SHARE_CELLS`) ->
            /// until when a source of that cell may have a cluster share (ns),
            /// raised by the daemon when it writes shares (the only writer: the
            /// kernel only reads it). The cheap tier judges no frame of a
            /// cluster-scoped rule whose cell is marked, so a source with a share
            /// is always held to it, never to the cheap tier's cold-cap
            /// allowance.
            SHARE_MARKS(share_marks): Array<u32, u64>,
                Fixed($crate::sketch::SHARE_CELLS), pinned;

            /// Penalties apart from the windows: `SourceKey` (the window's key)
            /// -> `Hold`, so that a window the daemon reclaims idle while its
            /// source is blocked comes back blocked. A plain hash, which never
            /// evicts: an ended penalty is deleted on sight or by the daemon's
            /// sweep. Full, a penalty lives only in its window
            /// (`Outcome::HoldFailed`).
            HOLDS(holds): Hash<$crate::SourceKey, $crate::Hold>,
                Sources($crate::maps::DEFAULT_MAX_SOURCES), pinned;

            /// This node's allowance per cluster-scoped source, written by the
            /// daemon: the window key (`SourceKey` with the rule's `budget` byte
            /// as class) -> `ClusterShare`. LRU: the daemon's inserts evict the
            /// least recently used share when full (that source falls back to
            /// the cold cap). Pinned: a restarted daemon finds its sources still
            /// held to their shares, which expire on their own (`expires_ns`),
            /// rather than all thrown back to the cold cap at once.
            CLUSTER_SHARES(cluster_shares): LruHash<$crate::SourceKey, $crate::ClusterShare>,
                Fixed($crate::cluster::DEFAULT_MAX_CLUSTER_SOURCES), pinned;

            /// The cluster state (an array of one `ClusterState`), refreshed by
            /// the daemon every sync. Pinned: while a restarted daemon catches
            /// up, the kernel keeps judging by the last refresh, and falls back
            /// on its own once it is stale, as it would with the daemon gone.
            CLUSTER(cluster): Array<u32, $crate::ClusterState>,
                Fixed(1), pinned;
        }
    };
}

//! Kernel tests of the XDP program through BPF_PROG_TEST_RUN: parsing,
//! verdicts and the exact per-source and per-outcome counters.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter_common::{Counter, Outcome, SourceKey};
use limiter_tests::{
    packets::{self, ip_offset, tagged, DST4, DST6, TPID_8021AD, TPID_8021Q},
    testrun::{frames, online_cpus, Harness, XDP_PASS},
};

const SRC4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const SRC6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 3, 4, 5, 6);

/// Runs `frame` `n` times on CPU 0, asserting every verdict is PASS.
fn pass_n(harness: &mut Harness, frame: &[u8], n: u64) {
    for i in 0..n {
        assert_eq!(harness.run_on_cpu(0, frame), XDP_PASS, "run {i}");
    }
}

/// Asserts `key` is tracked with exactly `want` summed over CPUs, and is
/// the only tracked source.
#[track_caller]
fn assert_only_source(harness: &Harness, key: SourceKey, want: Counter) {
    let sources = harness.sources();
    assert_eq!(sources.len(), 1, "tracked sources: {:?}", sources.keys());
    let per_cpu = sources.get(&key).expect("the frame's source is tracked");
    assert_eq!(limiter_user::kernel::read::total(per_cpu), want);
}

/// A counted IP frame: per-source counter, `passed`, and one `new_source`.
fn assert_counted_ip_frames(frame: &[u8], key: SourceKey, n: u64) {
    let mut harness = Harness::load();
    pass_n(&mut harness, frame, n);
    assert_only_source(&harness, key, frames(n, frame.len()));
    harness.assert_outcomes(&[
        (Outcome::Passed, frames(n, frame.len())),
        (Outcome::NewSource, frames(1, frame.len())),
    ]);
}

#[test]
fn ipv4_udp_is_counted_by_source() {
    let frame = packets::udp_v4(SRC4, DST4, 53, 32);
    assert_counted_ip_frames(&frame, SourceKey::v4(SRC4.octets()), 3);
}

#[test]
fn ipv4_tcp_and_icmp_share_their_source() {
    let mut harness = Harness::load();
    let tcp = packets::tcp_v4(SRC4, DST4, 443, 0);
    let icmp = packets::icmp_v4(SRC4, DST4, 56);
    pass_n(&mut harness, &tcp, 2);
    pass_n(&mut harness, &icmp, 1);
    let want = frames(2, tcp.len()).merged(frames(1, icmp.len()));
    assert_only_source(&harness, SourceKey::v4(SRC4.octets()), want);
    harness.assert_outcomes(&[
        (Outcome::Passed, want),
        (Outcome::NewSource, frames(1, tcp.len())),
    ]);
}

#[test]
fn ipv6_udp_is_counted_by_source() {
    let frame = packets::udp_v6(SRC6, DST6, 53, 10);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 4);
}

#[test]
fn ipv6_tcp_and_icmpv6_are_counted() {
    let frame = packets::tcp_v6(SRC6, DST6, 22, 0);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 1);
    let frame = packets::icmp_v6(SRC6, DST6, 8);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 2);
}

#[test]
fn single_tagged_vlan_frames_are_counted() {
    let frame = tagged(&packets::udp_v4(SRC4, DST4, 123, 48), TPID_8021Q, 100);
    assert_eq!(ip_offset(&frame), 18);
    assert_counted_ip_frames(&frame, SourceKey::v4(SRC4.octets()), 2);
    let frame = tagged(&packets::udp_v6(SRC6, DST6, 123, 48), TPID_8021Q, 4094);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 2);
}

#[test]
fn double_tagged_qinq_frames_are_counted() {
    let inner = tagged(&packets::udp_v4(SRC4, DST4, 53, 0), TPID_8021Q, 20);
    let frame = tagged(&inner, TPID_8021AD, 10);
    assert_eq!(ip_offset(&frame), 22);
    assert_counted_ip_frames(&frame, SourceKey::v4(SRC4.octets()), 3);

    let inner = tagged(&packets::tcp_v6(SRC6, DST6, 80, 0), TPID_8021Q, 20);
    let frame = tagged(&inner, TPID_8021AD, 10);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 1);
}

#[test]
fn three_vlan_tags_are_not_parsed_as_ip() {
    let mut frame = packets::udp_v4(SRC4, DST4, 53, 0);
    for vid in [3, 2, 1] {
        frame = tagged(&frame, TPID_8021Q, vid);
    }
    let mut harness = Harness::load();
    pass_n(&mut harness, &frame, 1);
    assert!(harness.sources().is_empty());
    harness.assert_outcomes(&[(Outcome::NonIp, frames(1, frame.len()))]);
}

#[test]
fn arp_passes_untouched_as_non_ip() {
    let frame = packets::arp();
    let mut harness = Harness::load();
    pass_n(&mut harness, &frame, 5);
    assert!(harness.sources().is_empty(), "ARP creates no source state");
    harness.assert_outcomes(&[(Outcome::NonIp, frames(5, frame.len()))]);
}

/// Every frame here is complete; cutting it at any byte past the Ethernet
/// header (the smallest frame BPF_PROG_TEST_RUN accepts) leaves a header
/// it announces incomplete. The second value is the length of its IP
/// header (with the offset of the IP header, where the source is readable).
fn truncation_templates() -> Vec<(&'static str, Vec<u8>, usize)> {
    vec![
        ("ipv4/udp", packets::udp_v4(SRC4, DST4, 53, 0), 20),
        ("ipv4/tcp", packets::tcp_v4(SRC4, DST4, 80, 0), 20),
        ("ipv6/udp", packets::udp_v6(SRC6, DST6, 53, 0), 40),
        ("ipv6/tcp", packets::tcp_v6(SRC6, DST6, 80, 0), 40),
        (
            "vlan/ipv4/udp",
            tagged(&packets::udp_v4(SRC4, DST4, 53, 0), TPID_8021Q, 7),
            20,
        ),
        (
            "qinq/ipv6/tcp",
            tagged(
                &tagged(&packets::tcp_v6(SRC6, DST6, 80, 0), TPID_8021Q, 7),
                TPID_8021AD,
                8,
            ),
            40,
        ),
    ]
}

/// A frame cut before the end of its IP header has no source to key it by:
/// malformed, passed to the stack (which drops it), no state. Cut anywhere
/// after, it has one: it is keyed and counted by its source like any other
/// (its ports unknown), so a cut transport header is no way around a limit.
#[test]
fn frames_cut_in_the_ip_header_are_malformed_and_after_it_are_counted() {
    for (name, full, ip_len) in truncation_templates() {
        let mut harness = Harness::load();
        let header_end = ip_offset(&full) + ip_len;
        let (mut malformed, mut counted) = (Counter::default(), Counter::default());
        for cut in packets::ETH_LEN..full.len() {
            let frame = &full[..cut];
            assert_eq!(
                harness.run_on_cpu(0, frame),
                XDP_PASS,
                "{name} cut at {cut}"
            );
            if cut < header_end {
                malformed.add(cut as u64);
            } else {
                counted.add(cut as u64);
            }
            assert_eq!(
                harness.outcome_total(Outcome::Malformed),
                malformed,
                "{name} cut at {cut}"
            );
        }
        let sources = harness.sources();
        assert_eq!(sources.len(), 1, "{name}: one source");
        let per_cpu = sources.values().next().expect("one");
        assert_eq!(
            limiter_user::kernel::read::total(per_cpu),
            counted,
            "{name}"
        );
        let first = (header_end..full.len()).next().map_or(0, |c| c as u64);
        harness.assert_outcomes(&[
            (Outcome::Malformed, malformed),
            (Outcome::Passed, counted),
            (
                Outcome::NewSource,
                Counter {
                    packets: 1,
                    bytes: first,
                },
            ),
        ]);
    }
}

#[test]
fn ipv4_with_an_invalid_header_length_is_still_keyed_by_its_source() {
    let mut harness = Harness::load();
    let mut want = Counter::default();
    for ihl in 0..5u8 {
        let mut frame = packets::udp_v4(SRC4, DST4, 53, 16);
        let ip = ip_offset(&frame);
        frame[ip] = 0x40 | ihl;
        assert_eq!(harness.run_on_cpu(0, &frame), XDP_PASS, "ihl {ihl}");
        want.add(frame.len() as u64);
    }
    assert_only_source(&harness, SourceKey::v4(SRC4.octets()), want);
    assert_eq!(
        harness.outcome_total(Outcome::Malformed),
        Counter::default()
    );
}

#[test]
fn wrong_ip_versions_are_malformed_and_a_short_total_length_is_keyed() {
    let mut harness = Harness::load();
    let mut v4_says_6 = packets::udp_v4(SRC4, DST4, 53, 0);
    v4_says_6[packets::ETH_LEN] = 0x65;
    let mut v6_says_4 = packets::udp_v6(SRC6, DST6, 53, 0);
    v6_says_4[packets::ETH_LEN] = 0x40;
    let mut want = Counter::default();
    for frame in [&v4_says_6, &v6_says_4] {
        assert_eq!(harness.run_on_cpu(0, frame), XDP_PASS);
        want.add(frame.len() as u64);
    }
    harness.assert_outcomes(&[(Outcome::Malformed, want)]);
    let mut short_total = packets::udp_v4(SRC4, DST4, 53, 0);
    short_total[packets::ETH_LEN + 2..packets::ETH_LEN + 4].copy_from_slice(&19u16.to_be_bytes());
    assert_eq!(harness.run_on_cpu(0, &short_total), XDP_PASS);
    assert_only_source(
        &harness,
        SourceKey::v4(SRC4.octets()),
        frames(1, short_total.len()),
    );
}

#[test]
fn ipv4_options_and_non_first_fragments_are_parsed() {
    // IHL 6: four bytes of options (NOPs) between IP and UDP headers.
    let plain = packets::udp_v4(SRC4, DST4, 53, 4);
    let ip = ip_offset(&plain);
    let mut with_options = plain[..ip + 20].to_vec();
    with_options.extend_from_slice(&[1, 1, 1, 1]);
    with_options.extend_from_slice(&plain[ip + 20..]);
    with_options[ip] = 0x46;
    let total = u16::from_be_bytes([plain[ip + 2], plain[ip + 3]]) + 4;
    with_options[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());

    // A non-first fragment carries no UDP header: only the IP header.
    let mut fragment = plain[..ip + 20].to_vec();
    fragment[ip + 6..ip + 8].copy_from_slice(&100u16.to_be_bytes());
    fragment[ip + 2..ip + 4].copy_from_slice(&20u16.to_be_bytes());

    let mut harness = Harness::load();
    pass_n(&mut harness, &with_options, 1);
    pass_n(&mut harness, &fragment, 1);
    let want = frames(1, with_options.len()).merged(frames(1, fragment.len()));
    assert_only_source(&harness, SourceKey::v4(SRC4.octets()), want);
    harness.assert_outcomes(&[
        (Outcome::Passed, want),
        (Outcome::NewSource, frames(1, with_options.len())),
    ]);
}

#[test]
fn ipv6_extension_headers_are_walked() {
    // Hop-by-hop options (8 bytes: next header, length 0, PadN) before UDP.
    let plain = packets::udp_v6(SRC6, DST6, 53, 0);
    let ip = ip_offset(&plain);
    let mut frame = plain[..ip + 40].to_vec();
    frame[ip + 6] = 0; // next header: hop-by-hop
    let payload_len = u16::from_be_bytes([plain[ip + 4], plain[ip + 5]]) + 8;
    frame[ip + 4..ip + 6].copy_from_slice(&payload_len.to_be_bytes());
    frame.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    frame.extend_from_slice(&plain[ip + 40..]);
    assert_counted_ip_frames(&frame, SourceKey::v6(SRC6.octets()), 2);

    // The same, cut inside the UDP header behind the extension header:
    // still keyed by its source (its ports unknown).
    let mut harness = Harness::load();
    pass_n(&mut harness, &frame[..frame.len() - 2], 1);
    assert_only_source(
        &harness,
        SourceKey::v6(SRC6.octets()),
        frames(1, frame.len() - 2),
    );
    assert_eq!(
        harness.outcome_total(Outcome::Malformed),
        Counter::default()
    );
}

#[test]
fn distinct_sources_get_distinct_counters() {
    let mut harness = Harness::load();
    let a = packets::udp_v4(Ipv4Addr::new(192, 0, 2, 1), DST4, 53, 0);
    let b = packets::udp_v4(Ipv4Addr::new(192, 0, 2, 2), DST4, 53, 100);
    let c = packets::udp_v6(SRC6, DST6, 53, 0);
    pass_n(&mut harness, &a, 3);
    pass_n(&mut harness, &b, 2);
    pass_n(&mut harness, &c, 1);
    let sources = harness.sources();
    assert_eq!(sources.len(), 3);
    let total = |key: SourceKey| limiter_user::kernel::read::total(&sources[&key]);
    assert_eq!(total(SourceKey::v4([192, 0, 2, 1])), frames(3, a.len()));
    assert_eq!(total(SourceKey::v4([192, 0, 2, 2])), frames(2, b.len()));
    assert_eq!(total(SourceKey::v6(SRC6.octets())), frames(1, c.len()));
    assert_eq!(
        harness.outcome_total(Outcome::NewSource).packets,
        3,
        "one new-source event per source"
    );
}

#[test]
fn per_cpu_slots_hold_each_cpus_packets_and_sum_exactly() {
    assert!(online_cpus() >= 2, "this test needs two CPUs");
    let mut harness = Harness::load();
    let frame = packets::udp_v4(SRC4, DST4, 53, 20);
    for _ in 0..5 {
        assert_eq!(harness.run_on_cpu(0, &frame), XDP_PASS);
    }
    for _ in 0..3 {
        assert_eq!(harness.run_on_cpu(1, &frame), XDP_PASS);
    }
    // One run of 7 repeats in a single syscall lands on CPU 1 as well.
    assert_eq!(harness.run_repeated_on_cpu(1, &frame, 7).0, XDP_PASS);

    let per_cpu = harness
        .source(&SourceKey::v4(SRC4.octets()))
        .expect("source tracked");
    assert_eq!(per_cpu[0], frames(5, frame.len()), "CPU 0 slot");
    assert_eq!(per_cpu[1], frames(10, frame.len()), "CPU 1 slot");
    assert!(
        per_cpu[2..].iter().all(|c| *c == Counter::default()),
        "other CPUs untouched: {per_cpu:?}"
    );
    assert_eq!(
        limiter_user::kernel::read::total(&per_cpu),
        frames(15, frame.len())
    );
    harness.assert_outcomes(&[
        (Outcome::Passed, frames(15, frame.len())),
        (Outcome::NewSource, frames(1, frame.len())),
    ]);
}

#[test]
fn a_full_map_evicts_the_least_recent_source_and_counts_every_packet() {
    let mut harness = Harness::load_with(&limiter_user::kernel::LoadOptions {
        max_sources: 64,
        max_hot_sources: Some(64),
        ..Default::default()
    });
    let n = 1000u32;
    let frame_len = packets::udp_v4(SRC4, DST4, 53, 0).len();
    for i in 0..n {
        let src = Ipv4Addr::from(0xc000_0200u32 + i);
        let frame = packets::udp_v4(src, DST4, 53, 0);
        assert_eq!(harness.run_on_cpu(0, &frame), XDP_PASS);
    }
    let sources = harness.sources();
    assert!(
        sources.len() <= 64,
        "the LRU map holds at most its capacity, got {}",
        sources.len()
    );
    let newest = SourceKey::v4(Ipv4Addr::from(0xc000_0200u32 + n - 1).octets());
    assert!(sources.contains_key(&newest), "the newest source is kept");
    let oldest = SourceKey::v4(Ipv4Addr::from(0xc000_0200u32).octets());
    assert!(
        !sources.contains_key(&oldest),
        "the oldest source was evicted"
    );
    assert_eq!(
        harness.outcome_total(Outcome::Passed),
        frames(u64::from(n), frame_len)
    );
    let created = harness.outcome_total(Outcome::NewSource).packets;
    let failed = harness.outcome_total(Outcome::InsertFailure).packets;
    assert_eq!(
        created + failed,
        u64::from(n),
        "every new source is accounted for"
    );
}

/// The verifier walks every path of the program; the kernel stops at one
/// million instructions. Datapath changes can multiply the paths without
/// looking larger, so the budget is checked here: the target of `bench
/// verifier`, which leaves the next features room on every kernel lane.
#[test]
fn the_verifier_walks_well_under_its_limit() {
    const BUDGET: u32 = 450_000;
    let mut harness = Harness::load();
    let program = harness.program_mut();
    let verified = program
        .info()
        .expect("program info")
        .verified_instruction_count()
        .expect("kernel reports verified instructions");
    eprintln!("the verifier walked {verified} instructions");
    assert!(
        verified < BUDGET,
        "the verifier walked {verified} instructions (budget {BUDGET} of its 1,000,000)"
    );
}

/// `check --functions`: the split of the verifier's work by function
/// adds up to the kernel's own figure for the program, and names the
/// entry point and the global `limit()`.
#[test]
fn the_verifier_work_by_function_adds_up_to_the_kernels_figure() {
    use limiter_user::kernel::verifier::per_function;
    let mut harness = Harness::load();
    let verified = harness
        .program_mut()
        .info()
        .expect("program info")
        .verified_instruction_count()
        .expect("kernel reports verified instructions");
    let split = per_function(limiter_common::names::PROGRAM).expect("the split");
    let names: Vec<&str> = split.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&limiter_common::names::PROGRAM), "{names:?}");
    assert!(names.contains(&"limit"), "{names:?}");
    let sum: u64 = split.iter().map(|f| f.instructions).sum();
    eprintln!("by function: {split:?}");
    assert_eq!(sum, u64::from(verified), "{split:?}");
}

/// The map table in `limiter_common::maps` describes the loaded program:
/// every map it defines and no other, with the kernel's own figures for
/// type, key and value sizes and capacity (`max_sources` and
/// `max_hot_sources` for the maps sized by them, twice `max_list_prefixes`
/// for the list tries). The kernel crate checks names and sizes when it
/// builds; this checks what the kernel made of them.
#[test]
fn the_loaded_maps_are_the_table() {
    use aya::maps::MapType;
    use limiter_common::maps::{MapKind, Sizing, ALL};
    let (max_sources, max_hot_sources, max_list_prefixes) = (1_000, 100, 10);
    let capacity = |sizing| match sizing {
        Sizing::Sources => Some(max_sources),
        Sizing::Windows => Some(limiter_common::maps::window_capacity(max_sources)),
        Sizing::HotSources => Some(max_hot_sources),
        Sizing::Lists => Some(2 * max_list_prefixes),
        Sizing::Fixed => None,
    };
    // The object as the kernel creates its maps, before the product's
    // loader takes them into typed handles.
    let mut loader = aya::EbpfLoader::new();
    for spec in &ALL {
        if let Some(entries) = capacity(spec.sizing) {
            loader.map_max_entries(spec.name, entries);
        }
    }
    let ebpf = loader
        .load(limiter_user::kernel::EBPF_OBJECT)
        .expect("load the object (root and BPF needed)");
    let mut loaded: Vec<&str> = ebpf.maps().map(|(name, _)| name).collect();
    loaded.sort_unstable();
    let mut table: Vec<&str> = ALL.iter().map(|spec| spec.name).collect();
    table.sort_unstable();
    assert_eq!(loaded, table);
    for (name, map) in ebpf.maps() {
        let spec = ALL
            .iter()
            .find(|spec| spec.name == name)
            .expect("in the table");
        let data = limiter_user::kernel::verifier::map_data(map)
            .unwrap_or_else(|| panic!("{name}: a map type the table has no kind for"));
        let info = data.info().expect("map info");
        let kind = match info.map_type().expect("a known map type") {
            MapType::Array => MapKind::Array,
            MapType::PerCpuArray => MapKind::PerCpuArray,
            MapType::LpmTrie => MapKind::LpmTrie,
            MapType::Hash => MapKind::Hash,
            MapType::LruHash => MapKind::LruHash,
            MapType::LruPerCpuHash => MapKind::LruPerCpuHash,
            MapType::RingBuf => MapKind::RingBuf,
            other => panic!("{name}: unexpected map type {other:?}"),
        };
        let max_entries = capacity(spec.sizing).unwrap_or(spec.max_entries);
        assert_eq!(
            (kind, info.key_size(), info.value_size(), info.max_entries()),
            (spec.kind, spec.key_size, spec.value_size, max_entries),
            "{name}"
        );
    }
}

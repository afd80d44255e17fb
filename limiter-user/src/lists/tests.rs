//! Reading and merging lists.

use ipnet::IpNet;
use limiter_common::lists::{ListAction, ListRef};

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

#[test]
fn a_file_takes_firehol_spamhaus_and_ipset_lines() {
    let text = "\
# FireHOL level1
1.10.16.0/20
192.0.2.7
2001:db8::/32 ; SBL123
; Spamhaus comment line
create blocked hash:net family inet hashsize 1024
add blocked 198.51.100.9/24

";
    assert_eq!(
        parse(text).unwrap(),
        vec![
            net("1.10.16.0/20"),
            net("192.0.2.7/32"),
            net("2001:db8::/32"),
            net("198.51.100.0/24"),
        ]
    );
}

#[test]
fn a_bad_line_is_named_by_its_number() {
    let (line, message) = parse("10.0.0.0/8\n\nnot-an-address\n").unwrap_err();
    assert_eq!(line, 3);
    assert!(message.contains("not-an-address"), "{message}");
    assert!(parse("10.0.0.0/33").is_err());
    assert!(parse("add blocked").is_err());
}

fn list(name: &str, action: ListAction, prefixes: &[&str]) -> List {
    List {
        name: name.into(),
        action,
        file: None,
        prefixes: prefixes.iter().map(|p| net(p)).collect(),
    }
}

#[test]
fn the_first_list_keeps_a_prefix_two_lists_hold() {
    let lists = [
        list(
            "office",
            ListAction::Allow,
            &["192.0.2.0/24", "2001:db8::/48"],
        ),
        list(
            "drop",
            ListAction::Deny,
            &["192.0.2.0/24", "10.0.0.0/8", "10.0.0.0/8"],
        ),
    ];
    let merged = merge(&lists, 10).unwrap();
    assert_eq!(merged.counts, vec![2, 1]);
    assert_eq!(
        merged.v4,
        vec![
            (8, [10, 0, 0, 0], ListRef::new(1, ListAction::Deny)),
            (24, [192, 0, 2, 0], ListRef::new(0, ListAction::Allow)),
        ]
    );
    assert_eq!(merged.v6.len(), 1);
}

#[test]
fn more_prefixes_than_the_capacity_are_refused() {
    let lists = [list(
        "drop",
        ListAction::Deny,
        &["10.0.0.0/8", "10.1.0.0/16"],
    )];
    let e = merge(&lists, 1).unwrap_err();
    assert!(e.to_string().contains("max_list_prefixes"), "{e}");
    assert!(merge(&lists, 2).is_ok());
}

#[test]
fn a_relative_file_is_read_beside_the_configuration() {
    let dir = std::env::temp_dir().join(format!("xdp-limiter-lists-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("drop.txt"), "203.0.113.0/24\n").unwrap();
    let section = ListSection {
        name: "drop".into(),
        action: crate::config::ListKind::Deny,
        file: Some("drop.txt".into()),
        prefixes: vec!["198.51.100.1".into()],
    };
    let lists = read_all(std::slice::from_ref(&section), Some(&dir)).unwrap();
    assert_eq!(
        lists[0].prefixes,
        vec![net("198.51.100.1/32"), net("203.0.113.0/24")]
    );
    let missing = ListSection {
        file: Some("absent.txt".into()),
        ..section
    };
    let e = read_all(&[missing], Some(&dir)).unwrap_err();
    assert!(e.to_string().contains("absent.txt"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

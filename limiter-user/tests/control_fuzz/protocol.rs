//! The control protocol parser: what every answer must be, and the
//! properties over random text, bytes, truncations and mutations.

use limiter_user::proto::{parse_request, Request, PROTOCOL_VERSION};
use proptest::{collection::vec, option, prelude::*, sample::select};
use serde_json::Value;

use super::{
    config,
    json::{mutation, Json, JUNK, VALUES},
    strategies::{line, request},
};

/// An error is a non-empty sentence that says what was wrong with the
/// request; an accepted request means the same once sent again.
pub(crate) fn check_answer(
    text: &str,
    answer: &Result<Request, String>,
) -> Result<(), TestCaseError> {
    match answer {
        Err(message) => {
            prop_assert!(!message.trim().is_empty(), "empty error for {:?}", text);
            prop_assert!(
                message.starts_with("malformed request: ")
                    || message.starts_with("protocol version "),
                "unclear error {:?} for {:?}",
                message,
                text
            );
        }
        Ok(request) => {
            let again = parse_request(&line(request));
            prop_assert_eq!(
                again.as_ref(),
                Ok(request),
                "{:?} does not survive a round trip",
                text
            );
        }
    }
    Ok(())
}

/// What a well-formed JSON object with top-level `entries` must be
/// answered with, as far as its version decides: a missing, mistyped or
/// duplicated version is named, another version number is named with it.
pub(crate) fn check_version(
    entries: &[(String, Json)],
    text: &str,
    answer: &Result<Request, String>,
) -> Result<(), TestCaseError> {
    let versions: Vec<&Json> = entries
        .iter()
        .filter(|(k, _)| k == "version")
        .map(|(_, v)| v)
        .collect();
    let value = match versions.as_slice() {
        [Json::Raw(raw)] => serde_json::from_str::<Value>(raw).ok(),
        [_] => Some(Value::Array(Vec::new())),
        _ => None,
    };
    match value {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(Value::Number(n)) => {
            let expect = format!("protocol version {n} is not supported");
            let message = answer.as_ref().err();
            prop_assert!(
                message.is_some_and(|m| m.starts_with(&expect)),
                "{:?} answered {:?}, not {:?}",
                text,
                answer,
                expect
            );
        }
        // Missing, null, mistyped or twice.
        _ => {
            let message = answer.as_ref().err();
            prop_assert!(
                message.is_some_and(|m| m.contains("`version`")),
                "{:?} answered {:?}, which does not name the version",
                text,
                answer
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_text_is_refused_clearly(text in any::<String>()) {
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn json_like_text_is_refused_clearly(text in "[{}\\[\\]\":,0-9a-z._ -]{0,80}") {
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn arbitrary_bytes_are_refused_clearly(bytes in vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
    }

    #[test]
    fn every_request_round_trips(request in request()) {
        prop_assert_eq!(parse_request(&line(&request)), Ok(request));
    }

    #[test]
    fn every_truncation_of_a_request_is_refused(request in request()) {
        let line = line(&request);
        let bytes = line.as_bytes();
        for cut in 0..bytes.len() {
            let text = String::from_utf8_lossy(&bytes[..cut]);
            let answer = parse_request(&text);
            prop_assert!(answer.is_err(), "{:?} was accepted", text);
            check_answer(&text, &answer)?;
        }
    }

    #[test]
    fn mutated_requests_are_refused_clearly_or_mean_what_they_say(
        request in request(),
        mutations in vec(mutation(), 1..6),
        junk in option::weighted(0.1, select(JUNK)),
    ) {
        let mut tree = Json::parse(&line(&request));
        for m in &mutations {
            m.apply(&mut tree);
        }
        let mut text = tree.render();
        if let Some(junk) = junk {
            text.push_str(junk);
        }
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
        // Well-formed JSON objects are judged on their version first.
        let well_formed = serde_json::from_str::<Value>(&text).is_ok();
        if let (true, Json::Object(entries)) = (well_formed, &tree) {
            check_version(entries, &text, &answer)?;
        }
    }

    #[test]
    fn other_versions_are_named(
        request in request(),
        version in prop_oneof![
            any::<u32>().prop_filter("another version", |v| *v != PROTOCOL_VERSION).prop_map(|v| v.to_string()),
            select(VALUES).prop_map(String::from),
        ],
    ) {
        let mut tree = Json::parse(&line(&request));
        let Json::Object(entries) = &mut tree else {
            unreachable!("a request is an object");
        };
        let slot = entries.iter_mut().find(|(k, _)| k == "version").expect("a version");
        slot.1 = Json::Raw(version);
        let text = tree.render();
        let answer = parse_request(&text);
        check_answer(&text, &answer)?;
        if serde_json::from_str::<Value>(&text).is_ok() {
            if let Json::Object(entries) = &tree {
                check_version(entries, &text, &answer)?;
            }
        }
    }
}
